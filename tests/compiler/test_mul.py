"""Products of two activations on the vector unit (VMUL): squeeze-excite gating ([1, C, 1, 1]
against [1, C, H, W], the gate from a 1x1 convolution or from a Gemm reshaped), two tensors of one
shape, and a row gate of a matrix. Each model runs whole on the NPU and matches onnxruntime's QDQ
model within one int8 step, and its float model in cosine."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.compiler.helpers import compare_int8, compile_model, cosine, ort_outputs


def _w(rng, *shape):
    return (rng.standard_normal(shape) * 0.4).astype(np.float32)


def _model(kind: str, c: int):
    rng = np.random.default_rng(8)
    inits = {"w1": _w(rng, c, 3, 3, 3), "w3": _w(rng, 4, c, 3, 3)}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
    ]
    if kind == "se_conv":  # MobileNetV3 / PP-LCNet style
        inits["w2"] = _w(rng, c, c, 1, 1)
        nodes += [
            helper.make_node("GlobalAveragePool", ["r1"], ["g"]),
            helper.make_node("Conv", ["g", "w2"], ["g2"]),
            helper.make_node("HardSigmoid", ["g2"], ["gate"], alpha=1 / 6, beta=0.5),
            helper.make_node("Mul", ["r1", "gate"], ["m"]),
        ]
    elif kind == "se_gemm":  # EfficientNet-style gate through a fully connected layer
        inits["fw"], inits["shape"] = _w(rng, c, c), np.array([1, c, 1, 1], np.int64)
        nodes += [
            helper.make_node("GlobalAveragePool", ["r1"], ["g"]),
            helper.make_node("Flatten", ["g"], ["gf"]),
            helper.make_node("Gemm", ["gf", "fw"], ["g2"], transB=1),
            helper.make_node("Sigmoid", ["g2"], ["gs"]),
            helper.make_node("Reshape", ["gs", "shape"], ["gate"]),
            helper.make_node("Mul", ["gate", "r1"], ["m"]),
        ]
    else:  # two tensors of one shape
        inits["w2"] = _w(rng, c, 3, 3, 3)
        nodes += [
            helper.make_node("Conv", ["x", "w2"], ["c2"], pads=[1, 1, 1, 1]),
            helper.make_node("Mul", ["r1", "c2"], ["m"]),
        ]
    nodes.append(helper.make_node("Conv", ["m", "w3"], ["y"], pads=[1, 1, 1, 1]))
    g = helper.make_graph(
        nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


@pytest.mark.parametrize("config", ["tiny", "default"])
@pytest.mark.parametrize("kind,c", [("se_conv", 16), ("se_conv", 6), ("se_gemm", 12), ("same_shape", 5)])
def test_product_of_two_activations_runs_on_the_npu(tmp_path, kind, c, config):
    model = _model(kind, c)
    rng = np.random.default_rng(9)
    calib = rng.standard_normal((16, 3, 8, 8)).astype(np.float32)
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    cm = compile_model(tmp_path, model, config, calib, f"{kind}{c}")
    layers = cm.lowered.layers
    assert all(la.placement != "host" for la in layers), [(la.op, la.reason) for la in layers if la.reason]
    assert sum(i.op.name == "VMUL" for i in cm.lowered.program) >= 1
    compare_int8(cm, x)
    (ref,) = ort_outputs(model, x)
    assert cosine(cm.run(x)[0], ref) > 0.99


def test_product_of_unrelated_shapes_goes_to_the_host(tmp_path):
    """[1, C, H, W] times [1, 1, H, W] (a spatial gate) is not a per-channel gate: the host runs it
    and the report says why."""
    rng = np.random.default_rng(10)
    inits = [
        numpy_helper.from_array(_w(rng, 4, 3, 3, 3), "w1"),
        numpy_helper.from_array(_w(rng, 1, 3, 3, 3), "w2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w2"], ["s"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["a", "s"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "spatial", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], inits,
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    cm = compile_model(tmp_path, m, "default", rng.standard_normal((8, 3, 6, 6)).astype(np.float32))
    mul = next(la for la in cm.lowered.layers if la.op == "Mul")
    assert mul.placement == "host" and "not a per-channel gate" in mul.reason, mul
