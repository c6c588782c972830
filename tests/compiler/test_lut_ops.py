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


def _model(kind: str, cmid: int = 6):
    rng = np.random.default_rng(3)
    nodes, inits = [], []
    h = _conv(nodes, inits, "x", "c1", 3, cmid, rng)
    h = _act(kind, nodes, inits, h)
    y = _conv(nodes, inits, h, "c2", cmid, 4, rng)
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 10])
    yo = helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 4, 10, 10])
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
    assert all(la.placement == "npu" for la in layers), [(la.op, la.placement, la.reason) for la in layers]
    # the chain between the convolutions is one table pass: its inner nodes are absorbed
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
