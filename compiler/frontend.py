"""ONNX front end: load and check a model, quantise float models to QDQ int8, find quantised tensors.

Float models are quantised with onnxruntime's static QDQ quantiser (int8 activations, symmetric
per-tensor int8 weights, int32 biases) from calibration data; QDQ models are taken as they are.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from npu.tensors import Layout


class CompileError(ValueError):
    """A model the compiler cannot take; the message names the file, node, operator and reason."""


MIN_OPSET = 13
ORT_MAX_IR = 10


@dataclass
class QTensor:
    """An int8 tensor: real value = scale * (q - zero_point)."""

    name: str
    shape: tuple[int, ...]
    scale: float
    zero_point: int


@dataclass
class Act:
    """A quantised activation placed in DRAM: `layout` says where each element lives."""

    q: QTensor
    addr: int
    layout: Layout

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes


def load(path: str | Path) -> onnx.ModelProto:
    p = Path(path)
    try:
        model = onnx.load(str(p))
    except FileNotFoundError:
        raise CompileError(f"{p}: no such file") from None
    except Exception as e:  # onnx raises DecodeError and friends for corrupt files
        raise CompileError(f"{p}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise CompileError(f"{p}: invalid ONNX model: {str(e).splitlines()[0]}") from None
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < MIN_OPSET:
        raise CompileError(f"{p}: opset {opset} is older than the supported {MIN_OPSET}")
    return shape_inference.infer_shapes(model)


def is_qdq(model: onnx.ModelProto) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def static_shape(model: onnx.ModelProto, name: str, where: str) -> tuple[int, ...]:
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        if vi.name == name:
            dims = []
            for d in vi.type.tensor_type.shape.dim:
                if not d.HasField("dim_value"):
                    label = d.dim_param or "?"
                    raise CompileError(
                        f"{where}: tensor {name!r} has a dynamic dimension ({label}); "
                        "the NPU needs static shapes (fix the batch size)"
                    )
                dims.append(d.dim_value)
            return tuple(dims)
    raise CompileError(f"{where}: no shape known for tensor {name!r}")


def quantize_float_model(model: onnx.ModelProto, calib: np.ndarray, source: str = "model") -> onnx.ModelProto:
    """Static QDQ int8 quantisation of a float model with onnxruntime, from calibration inputs."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    inputs = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    if len(inputs) != 1:
        raise CompileError(f"{source}: quantisation needs exactly one graph input, found {inputs}")
    batch = static_shape(model, inputs[0], source)[0]
    calib = np.asarray(calib, np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(range(0, len(calib) - batch + 1, batch))

        def get_next(self):
            i = next(self.it, None)
            return None if i is None else {inputs[0]: calib[i : i + batch]}

    if len(calib) < batch:
        raise CompileError(f"{source}: calibration data has {len(calib)} samples, the batch is {batch}")
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "float.onnx", Path(d) / "qdq.onnx"
        model = onnx.ModelProto.FromString(model.SerializeToString())
        model.ir_version = min(model.ir_version, ORT_MAX_IR)  # onnxruntime lags the onnx package
        onnx.save(model, str(src))
        quantize_static(
            str(src),
            str(dst),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=False,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            extra_options={"WeightSymmetric": True, "ActivationSymmetric": False},
        )
        return shape_inference.infer_shapes(onnx.load(str(dst)))


def node_attrs(n: onnx.NodeProto) -> dict:
    """A node's attributes as Python values."""
    return {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
