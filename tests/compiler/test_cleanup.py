"""Graph clean-up of exported-model idioms, checked against onnxruntime on the same float model."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npu.compiler import compile_onnx
from npu.compiler.cleanup import cleanup
from tests.compiler.helpers import compare_int8, ort_outputs, unfused_layers


def exported_style_model():
    """Conv -> BN -> Identity -> Dropout -> Reshape to (N, -1) via Shape/Gather/Concat arithmetic ->
    MatMul + Add (a PyTorch-style Linear), with a Constant node and ConstantOfShape."""
    rng = np.random.default_rng(0)
    n, c, h, w = 2, 4, 6, 6
    init = [
        numpy_helper.from_array(rng.normal(0, 0.3, (8, c, 3, 3)).astype(np.float32), "cw"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "cb"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "g"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "mu"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "var"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8 * h * w, 5)).astype(np.float32), "fw"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one_shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "b", "mu", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("Identity", ["r"], ["i"]),
        helper.make_node("Dropout", ["i"], ["d"]),
        helper.make_node("Shape", ["d"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["batch"], axis=0),
        helper.make_node(
            "ConstantOfShape",
            ["one_shape"],
            ["minus"],
            value=numpy_helper.from_array(np.array([-1], np.int64)),
        ),  # fmt: skip
        helper.make_node("Concat", ["batch", "minus"], ["shape2"], axis=0),
        helper.make_node("Reshape", ["d", "shape2"], ["flat"]),
        helper.make_node(
            "Constant", [], ["fb"], value=numpy_helper.from_array(rng.normal(0, 0.1, 5).astype(np.float32))
        ),
        helper.make_node("MatMul", ["flat", "fw"], ["mm"]),
        helper.make_node("Add", ["mm", "fb"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "exported", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 5])], init,
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_cleanup_folds_exported_idioms(tmp_path):
    m = exported_style_model()
    c = cleanup(m)
    ops = [n.op_type for n in c.graph.node]
    assert ops == ["Conv", "Relu", "Reshape", "Gemm"], ops
    x = np.random.default_rng(1).normal(size=(2, 4, 6, 6)).astype(np.float32)
    assert np.allclose(ort_outputs(m, x)[0], ort_outputs(c, x)[0], atol=1e-4)
    onnx.save(m, str(tmp_path / "e.onnx"))
    cm = compile_onnx(
        tmp_path / "e.onnx", calib=np.random.default_rng(2).normal(size=(16, 4, 6, 6)).astype(np.float32)
    )
    assert unfused_layers(cm) == [("Conv", "npu"), ("Reshape", "view"), ("Gemm", "npu")]
    compare_int8(cm, x)


def test_channel_affine_after_conv_folds_into_it():
    """Batch normalisation exported as Mul and Add of per-channel constants, a bias kept apart
    ([1, C, 1, 1]) and a scalar Div: one Conv, the same function. A constant minus the convolution
    is not folded (it negates), nor is a constant that varies over pixels."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.normal(size=(6, 4, 3, 3)).astype(np.float32), "w")
    gam = numpy_helper.from_array(rng.uniform(0.5, 2, (1, 6, 1, 1)).astype(np.float32), "gam")
    bet = numpy_helper.from_array(rng.normal(size=(6, 1, 1)).astype(np.float32), "bet")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    pix = numpy_helper.from_array(rng.normal(size=(1, 6, 6, 6)).astype(np.float32), "pix")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c", "gam"], ["m"]),
        helper.make_node("Add", ["bet", "m"], ["a"]),
        helper.make_node("Div", ["a", "two"], ["d"]),
        helper.make_node("Sub", ["two", "d"], ["s"]),  # not affine in the conv's direction: stays
        helper.make_node("Conv", ["s", "w2"], ["c2"]),
        helper.make_node("Add", ["c2", "pix"], ["y"]),  # per pixel: stays
    ]
    w2 = numpy_helper.from_array(rng.normal(size=(6, 6, 1, 1)).astype(np.float32), "w2")
    g = helper.make_graph(
        nodes, "affine", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 6, 6])], [w, gam, bet, two, pix, w2],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    c = cleanup(m)
    assert [n.op_type for n in c.graph.node] == ["Conv", "Sub", "Conv", "Add"]
    x = rng.normal(size=(1, 4, 6, 6)).astype(np.float32)
    assert np.allclose(ort_outputs(m, x)[0], ort_outputs(c, x)[0], atol=1e-4)
