"""Channel shuffles and channel slices (compiler/cleanup.py -> Gather of channels) run as views on the
NPU: the same bytes with a new channel map (compiler/ops/view.py), exact against onnxruntime."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu.compiler.cleanup import cleanup
from tests.compiler.helpers import compare_int8, compile_model, ort_outputs


def block(kind: str, shape=(1, 6, 5, 7)) -> onnx.ModelProto:
    """Conv (12 channels) -> a channel shuffle in 3 groups, or a Slice of channels 2..9 -> Conv."""
    rng = np.random.default_rng(7)
    n, _, h, w = shape
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (12, shape[1], 3, 3)).astype(np.float32), "w0")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="conv0")]
    if kind == "shuffle":
        inits += [numpy_helper.from_array(np.array([n, 3, 4, h, w], np.int64), "s5"),
                  numpy_helper.from_array(np.array([n, 12, h, w], np.int64), "s4")]  # fmt: skip
        nodes += [helper.make_node("Reshape", ["a", "s5"], ["r5"], name="r5"),
                  helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4], name="t5"),
                  helper.make_node("Reshape", ["t5", "s4"], ["b"], name="r4")]  # fmt: skip
        cb = 12
    else:
        inits += [numpy_helper.from_array(np.array([v], np.int64), k)
                  for k, v in (("st", 2), ("en", 9), ("ax", 1))]  # fmt: skip
        nodes.append(helper.make_node("Slice", ["a", "st", "en", "ax"], ["b"], name="slice"))
        cb = 7
    inits.append(numpy_helper.from_array(rng.normal(0, 0.4, (4, cb, 1, 1)).astype(np.float32), "w1"))
    nodes.append(helper.make_node("Conv", ["b", "w1"], ["y"], name="conv1"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 4, h, w])
    g = helper.make_graph(nodes, kind, [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("kind", ["shuffle", "slice"])
@pytest.mark.parametrize("config", ["tiny", "default"])
def test_channel_shuffle_and_slice_are_views(tmp_path, kind, config):
    m = block(kind)
    x = np.random.default_rng(2).normal(0, 1, (1, 6, 5, 7)).astype(np.float32)
    # the rewrite is exact in float
    want = ort_outputs(m, x)[0]
    np.testing.assert_allclose(ort_outputs(cleanup(m), x)[0], want, rtol=1e-5, atol=1e-5)
    calib = np.random.default_rng(1).normal(0, 1, (8, 6, 5, 7)).astype(np.float32)
    cm = compile_model(tmp_path, m, config, calib)
    la = {la.op: la for la in cm.lowered.layers}
    assert la["Gather"].placement == "view" and not {"Transpose", "Slice", "Reshape"} & set(la), la
    compare_int8(cm, x)


def test_zero_pad_before_a_convolution_becomes_its_padding(tmp_path):
    """An explicit asymmetric Pad (as TensorFlow's 'same' exports it) merges into the Conv."""
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (8, 6, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([0, 0, 0, 1, 0, 0, 1, 2], np.int64), "pads")]  # fmt: skip
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], mode="constant", name="pad"),
             helper.make_node("Conv", ["p", "w"], ["y"], pads=[1, 0, 0, 0], strides=[2, 2])]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 9, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 5, 5])
    g = helper.make_graph(nodes, "pad", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    xs = rng.normal(0, 1, (8, 6, 9, 8)).astype(np.float32)
    want = ort_outputs(m, xs[:1])[0]
    np.testing.assert_allclose(ort_outputs(cleanup(m), xs[:1])[0], want, rtol=1e-5, atol=1e-5)
    cm = compile_model(tmp_path, m, "tiny", xs)
    assert [la.op for la in cm.lowered.layers] == ["Conv"]
    compare_int8(cm, xs[:1])


@pytest.mark.parametrize("kind", ["bn", "affine"])
def test_per_channel_affine_without_a_convolution_runs_as_a_depthwise_conv(tmp_path, kind):
    """A BatchNormalization (or a per-channel Mul then Add) after a MaxPool: no Conv to fold it into,
    so it becomes a depthwise 1x1 Conv on the NPU (the Mul and Add fold into one)."""
    rng = np.random.default_rng(11)
    c = 6
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (c, c, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2])]  # fmt: skip
    if kind == "bn":
        for name, v in (("g", rng.uniform(0.5, 1.5, c)), ("be", rng.normal(0, 0.2, c)),
                        ("mu", rng.normal(0, 0.2, c)), ("var", rng.uniform(0.5, 2, c))):  # fmt: skip
            inits.append(numpy_helper.from_array(v.astype(np.float32), name))
        nodes.append(helper.make_node("BatchNormalization", ["p", "g", "be", "mu", "var"], ["y"], name="bn"))
    else:
        for name, v in (("s", rng.uniform(0.5, 2, (1, c, 1, 1))), ("t", rng.normal(0, 0.5, (1, c, 1, 1)))):
            inits.append(numpy_helper.from_array(v.astype(np.float32), name))
        nodes += [helper.make_node("Mul", ["p", "s"], ["q"], name="mul"),
                  helper.make_node("Add", ["q", "t"], ["y"], name="add")]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 8, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 4, 3])
    g = helper.make_graph(nodes, kind, [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    xs = rng.normal(0, 1, (8, c, 8, 6)).astype(np.float32)
    want = ort_outputs(m, xs[:1])[0]
    np.testing.assert_allclose(ort_outputs(cleanup(m), xs[:1])[0], want, rtol=1e-5, atol=1e-5)
    cm = compile_model(tmp_path, m, "tiny", xs)
    ops = [(la.op, la.placement) for la in cm.lowered.layers]
    assert ops == [("Conv", "npu"), ("MaxPool", "npu"), ("Conv", "npu")], ops
    compare_int8(cm, xs[:1])
