"""Element-wise functions of one activation on the NPU through VLUT tables: single activation
functions, the decompositions exporters write (SiLU, HardSwish, erf-GELU), scalar arithmetic, and
channel padding whose value the function changes. Each model runs whole on the NPU and matches
onnxruntime's QDQ model of the same graph within one int8 step (the golden model is bit-exact to
the RTL for VLUT: tests/hdl), and onnxruntime's float model in cosine."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu.compiler.elementwise import lut_program
from npu.compiler.ops.lut import CODES, table
from npu.config import get_config
from npu.program import ProgramBuilder
from tests.compiler.helpers import compare_int8, compile_model, cosine, ort_outputs
from tests.sim.helpers import assert_done, read, run_instrs


def _conv(nodes, inits, x, name, cin, cout, rng):
    w = (rng.standard_normal((cout, cin, 3, 3)) * 0.4).astype(np.float32)
    b = (rng.standard_normal(cout) * 0.2).astype(np.float32)
    inits += [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
    nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], pads=[1, 1, 1, 1]))
    return name


def _scalar(inits, name, v):
    inits.append(numpy_helper.from_array(np.array(v, np.float32), name))
    return name


def _act(kind: str, nodes, inits, x: str) -> str:
    """`kind` applied to x, the way exporters write it; the output's name."""

    def node(op, ins, **attrs):
        out = f"{kind}_{len(nodes)}"
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    if kind == "silu":
        return node("Mul", [x, node("Sigmoid", [x])])
    if kind == "hardswish_decomposed":  # x * Relu6(x + 3) / 6
        r6 = node("Clip", [node("Add", [x, _scalar(inits, "three", 3.0)]), _scalar(inits, "z", 0.0),
                           _scalar(inits, "six", 6.0)])  # fmt: skip
        return node("Mul", [x, node("Div", [r6, _scalar(inits, "six2", 6.0)])])
    if kind == "gelu_erf":  # 0.5 * x * (1 + erf(x / sqrt 2))
        e = node("Erf", [node("Div", [x, _scalar(inits, "sq2", np.sqrt(2.0))])])
        return node("Mul", [node("Mul", [x, node("Add", [e, _scalar(inits, "one", 1.0)])]),
                            _scalar(inits, "half", 0.5)])  # fmt: skip
    if kind == "scalar_affine":  # exp((x - 0.5) * 0.3)
        shifted = node("Sub", [x, _scalar(inits, "c", 0.5)])
        return node("Exp", [node("Mul", [shifted, _scalar(inits, "k", 0.3)])])
    if kind == "LeakyRelu":
        return node("LeakyRelu", [x], alpha=0.1)
    if kind == "tanh_then_leaky":
        return node("LeakyRelu", [node("Tanh", [x])], alpha=0.2)
    return node(kind, [x])


def _model(kind: str, cmid: int = 6, size: int = 10):
    rng = np.random.default_rng(3)
    nodes, inits = [], []
    h = _conv(nodes, inits, "x", "c1", 3, cmid, rng)
    h = _act(kind, nodes, inits, h)
    y = _conv(nodes, inits, h, "c2", cmid, 4, rng)
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])
    yo = helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 4, size, size])
    g = helper.make_graph(nodes, kind, [xi], [yo], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


KINDS = ["Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Softplus", "silu",
         "hardswish_decomposed", "gelu_erf", "scalar_affine", "tanh_then_leaky"]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_elementwise_function_runs_as_one_table(tmp_path, kind):
    model = _model(kind)
    rng = np.random.default_rng(4)
    calib = rng.standard_normal((16, 3, 10, 10)).astype(np.float32)
    x = rng.standard_normal((1, 3, 10, 10)).astype(np.float32)
    cm = compile_model(tmp_path, model, "default", calib, kind)
    layers = cm.lowered.layers
    assert [la.placement for la in layers] == ["npu", "view", "npu"], [(la.op, la.placement) for la in layers]
    # the chain between the convolutions is one table, its inner nodes absorbed, computed by the
    # first convolution on each band (test below)
    ops = [la.op for la in layers if la.op != "Conv"]
    assert ops == [model.graph.node[-2].op_type], ops
    assert sum(i.op.name == "VLUT" for i in cm.lowered.program) >= 1
    compare_int8(cm, x)
    (ref,) = ort_outputs(model, x)
    assert cosine(cm.run(x)[0], ref) > 0.99


@pytest.mark.parametrize("config", ["tiny", "default"])
def test_padding_channels_take_the_output_zero_point(config):
    """Channel padding holds a tensor's zero point (compiler/elementwise.py). Sigmoid sends real 0 to
    0.5, so the table would move the padding: the emitter resets it. The program runs on the golden
    model over 5 real channels padded to 16 per pixel, in chunks."""
    cfg = get_config(config)
    zp_in, zp_out, unit, pixels = -3, -128, 16, 300
    t = table(1 / (1 + np.exp(-0.05 * (CODES - zp_in))), 1 / 255, zp_out)
    assert t[zp_in + 128] != zp_out
    rng = np.random.default_rng(7)
    x = np.full((pixels, unit), zp_in, np.int8)
    x[:, :5] = rng.integers(-128, 128, (pixels, 5))
    src, dst, tab = 0x4000, 0x8000, 0x3000
    b = ProgramBuilder(cfg)
    lut_program(b, cfg, src, dst, x.size, tab, unit, [(5, unit - 5)], zp_out, max_step=200)
    m = run_instrs(cfg, b.build().instrs, {src: x, tab: t}, build=False)
    assert_done(m)
    y = read(m, dst, x.shape)
    assert np.array_equal(y[:, :5], t[x[:, :5].astype(int) + 128])
    assert np.all(y[:, 5:] == zp_out)
    assert sum(i.op.name == "VLUT" for i in b.build().instrs) > 1  # several chunks


@pytest.mark.parametrize("acts", ["int8", "int16"])
@pytest.mark.parametrize("kind", ["HardSwish", "silu", "Sigmoid", "hardswish_decomposed"])
def test_a_function_alone_after_a_convolution_runs_in_its_output_pass(tmp_path, monkeypatch, kind, acts):
    """A table function that alone reads a convolution's result is computed on each output band
    before the store (its vector passes under the next band's MATMULs, no pass of its own over
    DRAM): the same values as its own pass, in fewer cycles (32 x 32: several bands; a single
    band has nothing to overlap, docs/compiler.md). The first convolution's 6 channels are padded
    to 8, which the function must leave at its output's zero point."""
    import npu.compiler.ops as ops
    from npu.compiler.ops.registry import FUSED_NOTE
    from npu.sim.golden.runner import run_container

    model = _model(kind, size=32)
    rng = np.random.default_rng(4)
    calib = rng.standard_normal((8, 3, 32, 32)).astype(np.float32)
    x = rng.standard_normal((2, 1, 3, 32, 32)).astype(np.float32)
    cm = compile_model(tmp_path, model, "default", calib, kind, activations=acts)
    first = next(la for la in cm.lowered.layers if la.op == "Conv")
    fused = [la for la in cm.lowered.layers if la.placement == "view"]
    assert [la.op for la in fused] == [model.graph.node[-2].op_type], [
        (la.op, la.placement) for la in cm.lowered.layers
    ]
    assert fused[0].split == FUSED_NOTE + first.node and "on each band" in first.split
    monkeypatch.setattr(ops, "sole_reader", lambda ctx, name: None)
    own = compile_model(tmp_path, model, "default", calib, kind, activations=acts)
    assert all(la.placement == "npu" for la in own.lowered.layers)
    for xi in x:
        got, c_fused = run_container(cm.to_container(), [xi], cm.cfg)
        want, c_own = run_container(own.to_container(), [xi], own.cfg)
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
        assert c_fused["CYCLES"] < c_own["CYCLES"], (c_fused["CYCLES"], c_own["CYCLES"])
    (ref,) = ort_outputs(model, x[0])
    assert cosine(cm.run(x[0])[0], ref) > 0.99


def test_a_function_beside_another_reader_of_the_convolution_keeps_its_own_pass(tmp_path):
    """A convolution's result that something besides the function reads (a residual Add here) is
    stored as it is; the function runs as its own table pass."""
    rng = np.random.default_rng(3)
    nodes, inits = [], []
    h = _conv(nodes, inits, "x", "c1", 3, 8, rng)
    a = _act("HardSwish", nodes, inits, h)
    y = _conv(nodes, inits, a, "c2", 8, 8, rng)
    nodes.append(helper.make_node("Add", [y, h], ["sum"]))
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])
    yo = helper.make_tensor_value_info("sum", TensorProto.FLOAT, [1, 8, 16, 16])
    model = helper.make_model(
        helper.make_graph(nodes, "res", [xi], [yo], inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    calib = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
    cm = compile_model(tmp_path, model, "default", calib, "res")
    assert [(la.op, la.placement) for la in cm.lowered.layers] == [
        ("Conv", "npu"), ("HardSwish", "npu"), ("Conv", "npu"), ("Add", "view")
    ]  # fmt: skip  (the Add: c2's output pass, a residual)
    x = calib[:1]
    compare_int8(cm, x)
