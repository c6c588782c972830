"""The first pass: read an ONNX file, check that the compiler can start on it and prepare it
(`frontend.py`: opset conversion, input shapes, folding, layouts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx

from .frontend import Prepared, prepare
from .graph import CompileError


def load(path: str | Path, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Prepared:
    """The prepared model with inferred shapes; a missing, corrupt or invalid file, an opset that
    cannot be converted or a model no pass can take is a CompileError."""
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
    check_supported(model, str(p))
    taken = {n.name for n in model.graph.node}
    for i, n in enumerate(model.graph.node):  # the report and errors name every node
        if not n.name:
            n.name = next(x for x in (f"{n.op_type}#{i}", f"{n.op_type}#{i}_") if x not in taken)
    prepared = prepare(model, str(p), input_shapes)
    check_sizes(prepared.model, str(p))
    return prepared


def check_supported(model: onnx.ModelProto, source: str) -> None:
    """Refuse, by name, what no pass can handle: operators of custom domains, graph inputs that are
    not float."""
    for i, n in enumerate(model.graph.node):
        if n.domain not in ("", "ai.onnx") and not (
            n.domain == "com.microsoft" and n.op_type in ("QuantizeLinear", "DequantizeLinear")
        ):
            raise CompileError(
                f"{source}: node {n.name or f'#{i}'!r} ({n.domain}.{n.op_type}): operators of custom "
                "domains run neither on the NPU nor on the host (onnx.reference)"
            )
    inits = {t.name for t in model.graph.initializer}
    for v in model.graph.input:
        if v.name in inits:
            continue
        et = v.type.tensor_type.elem_type
        if et not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE):
            raise CompileError(
                f"{source}: graph input {v.name!r} is {onnx.TensorProto.DataType.Name(et).lower()}; "
                "the NPU takes float inputs (integer inputs such as token ids or indices are not "
                "supported: compute them outside the model or make the input float)"
            )


def check_sizes(model: onnx.ModelProto, source: str) -> None:
    """No tensor with a dimension of size 0 (checked once the inputs are static: an exporter's 0 in
    a graph input means a dynamic dimension)."""
    for v in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        dims = v.type.tensor_type.shape.dim
        if any(d.HasField("dim_value") and d.dim_value == 0 for d in dims):
            shape = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]
            raise CompileError(f"{source}: tensor {v.name!r} has shape {shape} with a dimension of size 0")


def is_qdq(model: onnx.ModelProto) -> bool:
    """True for a model that is already quantised (QuantizeLinear/DequantizeLinear pairs)."""
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
