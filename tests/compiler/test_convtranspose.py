"""ConvTranspose with stride = kernel on the NPU (compiler/ops/convtranspose.py), exact against
onnxruntime's QDQ model; its BatchNormalization folds into it (compiler/cleanup.py); other transposed
convolutions stay on the host with a reason."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.compiler.helpers import compare_int8, compile_model


def deconv_model(k, stride, cout=5, shape=(1, 6, 5, 7), bn=True, pads=(0, 0, 0, 0), add_bias=False):
    """Conv -> ConvTranspose [-> BatchNormalization] -> Relu -> Conv (a DBNet head's step)."""
    rng = np.random.default_rng(k * 10 + stride)
    cin = 8
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.4, (cin, shape[1], 3, 3)).astype(np.float32), "w0"),
        numpy_helper.from_array(rng.normal(0, 0.4, (cin, cout, k, k)).astype(np.float32), "wt"),
        numpy_helper.from_array(rng.normal(0, 0.1, cout).astype(np.float32), "bt"),
        numpy_helper.from_array(rng.normal(0, 0.4, (4, cout, 1, 1)).astype(np.float32), "w1"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("ConvTranspose", ["a", "wt", "bt"], ["t"], kernel_shape=[k, k],
                         strides=[stride, stride], pads=list(pads), name="deconv"),  # fmt: skip
    ]
    if add_bias:  # the bias as an Add of a (1, C, 1, 1) constant, as paddle2onnx exports it
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (1, cout, 1, 1)).astype(np.float32), "ab"))
        nodes.append(helper.make_node("Add", ["t", "ab"], ["ta"], name="bias_add"))
        nodes[-2].output[0], nodes[-1].input[0], nodes[-1].output[0] = "t0", "t0", "t"
    if bn:
        for name, v in (("g", rng.uniform(0.5, 1.5, cout)), ("be", rng.normal(0, 0.2, cout)),
                        ("mu", rng.normal(0, 0.2, cout)), ("var", rng.uniform(0.5, 2, cout))):  # fmt: skip
            inits.append(numpy_helper.from_array(v.astype(np.float32), name))
        nodes.append(helper.make_node("BatchNormalization", ["t", "g", "be", "mu", "var"], ["tb"], name="bn"))
    nodes += [helper.make_node("Relu", ["tb" if bn else "t"], ["r"], name="relu"),
              helper.make_node("Conv", ["r", "w1"], ["y"], name="conv1")]  # fmt: skip
    n, _, h, w = shape
    oh, ow = (h - 1) * stride + k - pads[0] - pads[2], (w - 1) * stride + k - pads[1] - pads[3]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 4, oh, ow])
    m = helper.make_model(helper.make_graph(nodes, "deconv", [x], [y], inits),
                          opset_imports=[helper.make_opsetid("", 13)])  # fmt: skip
    m.ir_version = 8
    return m


@pytest.mark.parametrize(
    ("k", "config", "add_bias"),
    [(2, "tiny", False), (2, "default", True), (3, "tiny", True), (2, "banked", False)],
)
def test_transposed_convolution_with_stride_equal_to_kernel_runs_on_the_npu(tmp_path, k, config, add_bias):
    m = deconv_model(k, k, add_bias=add_bias)
    calib = np.random.default_rng(1).normal(0, 1, (8, 6, 5, 7)).astype(np.float32)
    cm = compile_model(tmp_path, m, config, calib)
    ops = {la.op: la for la in cm.lowered.layers}
    assert "BatchNormalization" not in ops and "Add" not in ops, ops  # folded into the ConvTranspose
    assert ops["ConvTranspose"].placement == "npu", ops
    compare_int8(cm, np.random.default_rng(2).normal(0, 1, (1, 6, 5, 7)).astype(np.float32))


def test_overlapping_transposed_convolution_goes_to_the_host(tmp_path):
    m = deconv_model(3, 2, bn=False, pads=(1, 1, 1, 1))
    calib = np.random.default_rng(1).normal(0, 1, (8, 6, 5, 7)).astype(np.float32)
    cm = compile_model(tmp_path, m, "tiny", calib)
    la = next(la for la in cm.lowered.layers if la.op == "ConvTranspose")
    assert la.placement == "host" and "stride is not its kernel" in la.reason, la
    compare_int8(cm, calib[:1])
