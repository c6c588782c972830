"""Attention on the NPU: the heads' Reshape/Transpose as views or row copies, Q K^T and P V as MatMuls
of two activations (compiler/ops/heads.py). Each model matches onnxruntime's QDQ model within one
int8 step and its float model in cosine; the timed golden model computes what the in-order run does."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu.tensors import Layout
from tests.compiler.helpers import compare_int8, compile_model, cosine, ort_outputs


def attention_block(t: int, d: int, heads: int, torch_style: bool = False, seed: int = 0) -> onnx.ModelProto:
    """A pre-norm transformer encoder block on (1, t, d) tokens. `torch_style`: K^T as PyTorch
    exports `k.transpose(-2, -1)` after the heads' transpose, and the scale as a Div."""
    rng = np.random.default_rng(seed)
    dh = d // heads
    inits, nodes = [], []

    def c(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def n(op, ins, out, **kw):
        nodes.append(helper.make_node(op, ins, [out], name=out, **kw))
        return out

    def w(name, k, m):
        return c(name, rng.normal(0, k**-0.5, (k, m)).astype(np.float32))

    f32 = np.float32
    ln1 = n("LayerNormalization", ["x", c("g1", np.ones(d, f32)), c("b1", np.zeros(d, f32))], "ln1", axis=-1)
    shp = c("shp", np.array([1, t, heads, dh], np.int64))
    q, k, v = (n("MatMul", [ln1, w(f"w{s}", d, d)], s) for s in "qkv")
    qh = n("Transpose", [n("Reshape", [q, shp], "qr")], "qh", perm=[0, 2, 1, 3])
    if torch_style:
        kt = n("Transpose", [n("Transpose", [n("Reshape", [k, shp], "kr")], "kh", perm=[0, 2, 1, 3])], "kt",
               perm=[0, 1, 3, 2])  # fmt: skip
    else:
        kt = n("Transpose", [n("Reshape", [k, shp], "kr")], "kt", perm=[0, 2, 3, 1])
    vh = n("Transpose", [n("Reshape", [v, shp], "vr")], "vh", perm=[0, 2, 1, 3])
    qk = n("MatMul", [qh, kt], "qk")
    if torch_style:
        s = n("Div", [qk, c("sc", np.array(dh**0.5, f32))], "s")
    else:
        s = n("Mul", [qk, c("sc", np.array(dh**-0.5, f32))], "s")
    o = n("MatMul", [n("Softmax", [s], "p", axis=-1), vh], "o")
    o2 = n(
        "Reshape",
        [n("Transpose", [o], "ot", perm=[0, 2, 1, 3]), c("shp2", np.array([1, t, d], np.int64))],
        "o2",
    )
    a = n("Add", ["x", n("MatMul", [o2, w("wo", d, d)], "proj")], "res1")
    ln2 = n("LayerNormalization", [a, c("g2", np.ones(d, f32)), c("b2", np.zeros(d, f32))], "ln2", axis=-1)
    f = n(
        "Relu",
        [n("Add", [n("MatMul", [ln2, w("w1", d, 2 * d)], "f1"), c("bf", np.zeros(2 * d, f32))], "f1b")],
        "f1r",
    )
    y = n("Add", [a, n("MatMul", [f, w("w2", 2 * d, d)], "f2")], "y")
    g = helper.make_graph(
        nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, t, d])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, t, d])], inits,
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _data(t: int, d: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (n, t, d)).astype(np.float32)


def _products_on_the_npu(cm) -> None:
    layers = {la.node: la for la in cm.lowered.layers}
    for name in ("qk", "o"):
        assert layers[name].placement == "npu", (name, layers[name].reason)
    for name, la in layers.items():
        if la.op == "Transpose":
            assert la.placement in ("view", "npu"), (name, la.reason)


@pytest.mark.parametrize("config", ["tiny", "default"])
@pytest.mark.parametrize("t,d,heads,torch_style", [(16, 32, 2, False), (10, 24, 2, True)])
def test_attention_products_run_on_the_npu_int8(tmp_path, config, t, d, heads, torch_style):
    model = attention_block(t, d, heads, torch_style)
    cm = compile_model(tmp_path, model, config, _data(t, d, 16, 1), f"attn{t}")
    _products_on_the_npu(cm)
    x = _data(t, d, 1, 2)
    compare_int8(cm, x)
    (ref,) = ort_outputs(model, x)
    got = cm.run(x)[0]
    assert cosine(got, ref) > 0.99
    np.testing.assert_array_equal(cm.run(x, timed=True)[0], got)  # the tokens order what they must


def test_attention_with_the_default_options_keeps_its_accuracy(tmp_path):
    """auto's int8/int16 mix: the products' operands symmetric (the second int8), every MAC on the
    NPU, and held-out inputs at the accuracy target."""
    t, d = 16, 32
    model = attention_block(t, d, 2)
    cm = compile_model(tmp_path, model, "default", _data(t, d, 16, 3), "attn", activations="auto")
    _products_on_the_npu(cm)
    assert cm.placement.macs_host == 0 < cm.placement.macs_npu, cm.placement
    for s in range(4):
        x = _data(t, d, 1, 10 + s)
        (ref,) = ort_outputs(model, x)
        assert cosine(cm.run(x)[0], ref) >= 0.99


def test_a_transpose_moving_the_last_axis_for_other_readers_goes_to_the_host(tmp_path):
    rng = np.random.default_rng(4)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Sigmoid", ["t"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "tr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8])],
        [numpy_helper.from_array(rng.normal(0, 0.3, (16, 16)).astype(np.float32), "w")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    cm = compile_model(tmp_path, m, "default", _data(8, 16, 8, 5))
    tr = next(la for la in cm.lowered.layers if la.op == "Transpose")
    assert tr.placement == "host" and "moves the last axis" in tr.reason, tr
    x = _data(8, 16, 1, 6)
    assert cosine(cm.run(x)[0], ort_outputs(m, x)[0]) > 0.99


def test_a_transposed_layout_addresses_its_base_and_round_trips():
    lay = Layout.transposed((2, 3, 4), (1, 2, 0), elem=2)
    assert lay.shape == (3, 4, 2) and lay.nbytes == 48
    assert lay.strides == (8, 2, 24)
    base = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    assert np.array_equal(lay.unpack(base.tobytes()), base.transpose(1, 2, 0))
    assert Layout.from_json(lay.to_json()) == lay
    with pytest.raises(ValueError, match="not a permutation"):
        Layout.transposed((2, 3), (0, 0))
