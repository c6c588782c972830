"""ConvTranspose with stride = kernel on the NPU (compiler/ops/convtranspose.py), exact against
onnxruntime's QDQ model; its BatchNormalization folds into it (compiler/cleanup.py); other transposed
convolutions stay on the host with a reason."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu.compiler.ops import convtranspose
from tests.compiler.helpers import compare_int8, compile_model


def npu_cycles(cm) -> int:
    """The golden model's timing of the program's NPU layers (the compile's own figures)."""
    return sum(la.est_cycles or 0 for la in cm.lowered.layers if la.placement == "npu")


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


def head_model(k=2, width=8, cin=8, reader="Sigmoid"):
    """Conv -> Relu -> ConvTranspose to one channel -> `reader` (a DBNet head's probability map)."""
    rng = np.random.default_rng(k + width)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.4, (cin, 3, 3, 3)).astype(np.float32), "w0"),
        numpy_helper.from_array(rng.normal(0, 0.4, (cin, 1, k, k)).astype(np.float32), "wt"),
        numpy_helper.from_array(np.array([0.3], np.float32), "bt"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("ConvTranspose", ["r", "wt", "bt"], ["t"], kernel_shape=[k, k], strides=[k, k],
                         name="deconv"),  # fmt: skip
    ]
    if reader in ("Conv", "Sigmoid+Conv"):  # a reader that needs a feature map (HWC), or its reader
        inits.append(numpy_helper.from_array(rng.normal(0, 0.4, (2, 1, 1, 1)).astype(np.float32), "w1"))
        if reader == "Sigmoid+Conv":
            nodes.append(helper.make_node("Sigmoid", ["t"], ["ts"], name="sig"))
        src = "ts" if reader == "Sigmoid+Conv" else "t"
        nodes.append(helper.make_node("Conv", [src, "w1"], ["y"], name="conv1"))
        cout = 2
    else:
        nodes.append(helper.make_node(reader, ["t"], ["y"], name="head"))
        cout = 1
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 4 * k, width * k])
    m = helper.make_model(helper.make_graph(nodes, "head", [x], [y], inits),
                          opset_imports=[helper.make_opsetid("", 13)])  # fmt: skip
    m.ir_version = 8
    return m


@pytest.mark.parametrize(
    ("k", "width", "config", "activations"),
    [(2, 8, "default", "int8"), (2, 16, "default", "int16"), (3, 24, "tiny", "int8"), (2, 8, "banked", "int16")],  # noqa: E501
)
def test_one_channel_output_read_by_a_table_function_is_stored_dense(
    tmp_path, monkeypatch, k, width, config, activations
):
    """A single output channel that only a Sigmoid reads is stored dense (no lane word per pixel):
    the same values as the HWC program bit for bit, int8 exact against onnxruntime's QDQ model (an
    int16 Sigmoid goes through an int8-resolution table either way), and fewer cycles (the store
    and the Sigmoid's pass handle one element a pixel)."""
    m = head_model(k, width)
    calib = np.random.default_rng(1).normal(0, 1, (8, 3, 4, width)).astype(np.float32)
    x = np.random.default_rng(2).normal(0, 1, (1, 3, 4, width)).astype(np.float32)
    opts = dict(activations=activations, accuracy_check=False)
    cm = compile_model(tmp_path, m, config, calib, name="dense", **opts)
    la = next(la for la in cm.lowered.layers if la.op == "ConvTranspose")
    assert la.placement == "npu" and "stored dense" in la.split, la
    assert cm.lowered.outputs[0].layout.kind == "dense"
    if activations == "int8":
        compare_int8(cm, x)
    monkeypatch.setattr(convtranspose, "dense_group", lambda *a: None)
    hwc = compile_model(tmp_path, m, config, calib, name="hwc", **opts)
    assert hwc.lowered.outputs[0].layout.kind == "hwc"
    assert all(np.array_equal(a, b) for a, b in zip(cm.run_int8(x), hwc.run_int8(x), strict=True))
    assert npu_cycles(cm) < npu_cycles(hwc), (npu_cycles(cm), npu_cycles(hwc))


@pytest.mark.parametrize("reader", ["Conv", "Sigmoid", "Sigmoid+Conv"])
def test_one_channel_output_stays_hwc_where_a_reader_needs_a_feature_map(tmp_path, reader):
    """A width the pixel groups do not divide, or a reader other than a table function (a Conv, also
    one after the table function, whose output keeps its input's layout), keeps the HWC layout, and
    the model still runs exactly."""
    m = head_model(2, 6 if reader == "Sigmoid" else 8, reader=reader)
    w = 6 if reader == "Sigmoid" else 8
    calib = np.random.default_rng(1).normal(0, 1, (8, 3, 4, w)).astype(np.float32)
    cm = compile_model(tmp_path, m, "default", calib, accuracy_check=False)
    la = next(la for la in cm.lowered.layers if la.op == "ConvTranspose")
    assert la.placement == "npu" and "dense" not in la.split, la
    compare_int8(cm, calib[:1])
