"""int16 activations (`activations="int16"`, A16W8): each NPU operator family against onnxruntime
running the same int16 QDQ model, within 1 int16 step on 99 % of the elements (the rule of
test_operators.py), and the front end's int16 quantisation."""

import numpy as np
import onnx
import pytest

from npu.compiler import CompileError, compile_onnx, precision
from npu.models import zoo
from npu.models.builder import Net
from tests.compiler.helpers import compare_int8, compile_model, cosine, on_npu, ort_outputs
from tests.compiler.test_operators import CONVS, calib_for, conv_net


def check16(tmp_path, net: Net, outs, config="default", seed=1):
    model = net.model(outs)
    shape = net.shapes[net.input]
    cm = compile_model(
        tmp_path, model, config, calib_for(shape), activations="int16", output_precision="int8"
    )
    x = np.random.default_rng(seed).normal(0, 1, shape).astype(np.float32)
    compare_int8(cm, x)
    return cm


@pytest.mark.parametrize("config", ["tiny", "default", "banked"])
@pytest.mark.parametrize("spec", CONVS, ids=lambda s: "c{}-{}-k{}-s{}-p{}-g{}".format(*s[:6]))
def test_conv_int16(tmp_path, config, spec):
    net, y = conv_net(spec)
    cm = check16(tmp_path, net, [y], config)
    assert [la.op for la in cm.lowered.layers] == ["Conv"]


FUNCTIONS = {
    "hardswish": lambda x: x * np.clip(x + 3, 0, 6) / 6,
    "hardswish-affine": lambda x: 0.47 * x * np.clip(x + 3, 0, 6) / 6 + 1.5,
    "hardsigmoid": lambda x: np.clip(x / 6 + 0.5, 0, 1),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh,
    "leaky-relu": lambda x: np.where(x > 0, x, 0.1 * x),
    "gelu": lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3))),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_int16_unary_functions(name):
    """A function of an int16 tensor (ops/lut.py `table16`): the program, run on the golden model
    over every int16 code, gives exactly the outputs `table16` simulated (its reported error), and
    that error is small: piecewise-linear functions within a step, smooth ones within a few steps
    near zero (weighted RMS, int16 output steps)."""
    from npu.compiler.elementwise import lut16_program
    from npu.compiler.ops.lut import WEIGHT_SCALE, codes, table16
    from npu.compiler.quantize import QTensor
    from npu.config import get_config
    from npu.program import ProgramBuilder
    from tests.sim.helpers import assert_done, run_instrs

    cfg = get_config("default")
    xq = QTensor("x", (1,), 12 / 32767, 0, 2)
    c = codes(xq)
    v = FUNCTIONS[name](c * xq.scale).astype(np.float32)
    yq = QTensor("y", (1,), 2 * float(np.abs(v).max()) / 32767, 0, 2)
    t = table16(v, xq, yq, name)
    b = ProgramBuilder(cfg)
    src, dst, tab = 0x10000, 0x100000, 0x8000
    lut16_program(b, cfg, src, dst, len(c), None if t.table is None else tab, 64, [], t.passes, yq)
    dram = {src: c.astype("<i2")}
    if t.table is not None:
        dram[tab] = t.table
    m = run_instrs(cfg, b.build().instrs, dram, build=False)
    assert_done(m)
    got = np.frombuffer(m.read_dram(dst, 2 * len(c)), "<i2").astype(np.int64)
    want = np.clip(np.rint(v.astype(np.float64) / yq.scale), -32768, 32767)
    w = np.exp(-np.abs(c) / (WEIGHT_SCALE * xq.qmax))
    err = float(np.sqrt(np.sum(w * (got - want) ** 2) / w.sum()))
    assert err == pytest.approx(t.error, rel=1e-9, abs=1e-9), t.how
    # piecewise-linear: exact to a step; gated (x * g(x)): a few steps; bounded smooth functions
    # (sigmoid, tanh) at the table's int8 resolution: below one int8 step of the output (128 steps)
    limits = {"hardswish": 1, "hardswish-affine": 1, "hardsigmoid": 1, "sigmoid": 128, "tanh": 128}
    limit = limits.get(name, 8)
    assert err <= limit, (t.how, err)


def _hardswish(net: Net, x: str) -> str:
    shape = net.shapes[x]
    t = net.node("HardSigmoid", [x], shape, alpha=1 / 6, beta=0.5)
    return net.node("Mul", [x, t], shape)


def _se_gate(net: Net, h: str) -> str:
    gate = net.node("Sigmoid", [net.conv(net.gap(h), 16, 1, relu=False)], (1, 16, 1, 1))
    return net.node("Mul", [h, gate], net.shapes[h])


NETS = {
    "conv-relu-maxpool": lambda net: net.maxpool(
        net.relu(net.conv(net.input, 16, 3, pad=1, relu=False)), 3, 2, 1
    ),
    "conv-sppf-maxpool": lambda net: net.maxpool(net.conv(net.input, 16, 3, pad=1, relu=False), 5, 1, 2),
    "avgpool-gap-gemm": lambda net: net.gemm(
        net.flatten(net.gap(net.avgpool(net.conv(net.input, 16, 3, pad=1), 2, 2))), 10
    ),
    "add-concat": lambda net: net.concat(
        [net.add(net.conv(net.input, 8, 1, relu=False), net.conv(net.input, 8, 3, pad=1, relu=False)),
         net.conv(net.input, 16, 1, relu=False)]
    ),
    "hardswish-se-gate": lambda net: _se_gate(
        net, _hardswish(net, net.conv(net.input, 16, 3, pad=1, relu=False))
    ),
    "resize-clip": lambda net: net.clip(net.node(
        "Resize", [net.conv(net.input, 8, 1, relu=False), "", net.const(np.array([1, 1, 2, 2], np.float32))],
        (1, 8, 16, 16), mode="nearest"), -1.0, 2.0),
}


@pytest.mark.parametrize("config", ["tiny", "default", "banked"])
@pytest.mark.parametrize("name", sorted(NETS))
def test_operators_int16(tmp_path, config, name):
    """Pooling, GEMM, Add, Concat, Resize, Clip, table functions and gates on int16 activations: every
    node on the NPU, within one int16 step of onnxruntime's int16 QDQ model on 99 % of the outputs."""
    net = Net(name, (1, 8, 8, 8), seed=5)
    y = NETS[name](net)
    cm = check16(tmp_path, net, [y], config)
    host = [(la.node, la.op, la.reason) for la in cm.lowered.layers if la.placement == "host"]
    assert not host, host


def _deconv(net: Net, x: str) -> str:
    """A 2x2, stride-2 ConvTranspose (the upsampling of a DBNet head)."""
    n, c, h, w = net.shapes[x]
    wt = net.const(net.rng.normal(0, 0.4, (c, 8, 2, 2)).astype(np.float32))
    return net.node("ConvTranspose", [x, wt], (n, 8, 2 * h, 2 * w), kernel_shape=[2, 2], strides=[2, 2])


RELU_AFTER = {
    "Conv": lambda net: net.conv(net.relu(net.conv(net.input, 16, 3, pad=1, relu=False)), 8, 1),
    "Gemm": lambda net: net.gemm(net.relu(net.gemm(net.flatten(net.gap(net.input)), 24)), 10),
    "ConvTranspose": lambda net: net.conv(net.relu(_deconv(net, net.input)), 8, 1, relu=False),
    "Add": lambda net: net.conv(
        net.relu(net.add(net.conv(net.input, 8, 3, pad=1, relu=False), net.input)), 8, 1, relu=False
    ),
}


@pytest.mark.parametrize("config", ["tiny", "banked"])
@pytest.mark.parametrize("op", sorted(RELU_AFTER))
def test_relu_after_int16_producer_is_fused(tmp_path, config, op):
    """onnxruntime keeps a Relu after an int16 tensor as a node; the Conv, Gemm, ConvTranspose or
    Add (a residual) before it requantises straight to the Relu's output clamped at zero, and the
    Relu is a view (no vector pass) - within one int16 step of onnxruntime."""
    net = Net(f"relu_after_{op}", (1, 8, 8, 8), seed=7)
    cm = check16(tmp_path, net, [RELU_AFTER[op](net)], config)
    relus = [la for la in cm.lowered.layers if la.op == "Relu"]
    assert relus and all(la.placement == "view" for la in relus), relus
    assert all(on_npu(la) for la in cm.lowered.layers if la.op == op)  # (an Add: the conv's output pass)


RELU6_AFTER = {
    "Conv": lambda net: net.conv(net.clip(net.conv(net.input, 16, 3, pad=1, relu=False), 0.0, 6.0), 8, 1),
    "Gemm": lambda net: net.gemm(net.clip(net.gemm(net.flatten(net.gap(net.input)), 24), 0.0, 6.0), 10),
    "Add": lambda net: net.conv(
        net.clip(net.add(net.conv(net.input, 8, 3, pad=1, relu=False), net.input), 0.0, 6.0), 8, 1, relu=False
    ),
}


@pytest.mark.parametrize("config", ["tiny", "banked"])
@pytest.mark.parametrize("op", sorted(RELU6_AFTER))
def test_relu6_after_int16_producer_is_fused(tmp_path, config, op):
    """A Clip at zero whose upper bound its int16 output saturates at (a ReLU6: the Clip's symmetric
    range puts 6 at the top code) is computed as a fused Relu is, a view; a Clip that clamps below
    zero or not at all (a Clip with no lower bound) stays a vector pass. Both within the int16 rule
    of onnxruntime (compare_int8)."""
    net = Net(f"relu6_after_{op}", (1, 8, 8, 8), seed=7)
    cm = check16(tmp_path, net, [RELU6_AFTER[op](net)], config)
    clips = [la for la in cm.lowered.layers if la.op == "Clip"]
    assert clips and all(la.placement == "view" for la in clips), clips
    net = Net(f"clip_after_{op}", (1, 8, 8, 8), seed=7)
    x = net.conv(net.input, 16, 3, pad=1, relu=False)
    y = net.conv(net.node("Clip", [x, "", net.const(np.float32(6.0), "hi")], net.shapes[x]), 8, 1)
    cm = check16(tmp_path, net, [y], config)
    assert [la.placement for la in cm.lowered.layers if la.op == "Clip"] == ["npu"]


def _two_convs(tmp_path, size: int):
    net = Net("fit", (1, 8, size, size), seed=3)
    y = net.gemm(net.flatten(net.gap(net.conv(net.maxpool(net.conv(net.input, 16, 3), 2, 2), 32, 3))), 10)
    onnx.save(net.model([y]), str(tmp_path / "m.onnx"))
    return tmp_path / "m.onnx", np.random.default_rng(0).normal(size=(8, 8, size, size)).astype(np.float32)


def test_auto_takes_int16_and_int8_where_int16_does_not_fit(tmp_path, monkeypatch):
    """Where the default (`activations="auto"`) keeps int16 everywhere (here: the mix's selection
    made to find the outputs blind to int8 noise, test_precision.py), it compiles with int16
    activations; on `tiny` (64 KiB of DRAM) a model whose int16 activations do not fit is compiled
    with int8 ones, and the report says why (asking for int16 is the error that says so)."""
    monkeypatch.setattr(precision, "RESPONSE", 2.0)
    path, calib = _two_convs(tmp_path, 12)
    cm = compile_onnx(path, "tiny", calib=calib)
    assert cm.quantisation.startswith("int16 activations (mixed: the calibration outputs do not respond")
    assert cm.quantisation.endswith("(auto)")
    assert cm.lowered.inputs[0].layout.elem == 2
    path, calib = _two_convs(tmp_path, 32)
    with pytest.raises(CompileError, match="bytes of DRAM on tiny") as e16:
        compile_onnx(path, "tiny", calib=calib, activations="int16")
    cm = compile_onnx(path, "tiny", calib=calib)
    assert cm.quantisation.startswith("int8 activations"), cm.quantisation
    assert f"(auto: int16 activations did not compile: {e16.value})" in cm.report()
    assert cm.lowered.inputs[0].layout.elem == 1
    x = np.random.default_rng(1).normal(size=(1, 8, 32, 32)).astype(np.float32)
    compare_int8(cm, x)
    with pytest.raises(CompileError, match="activations must be one of auto, int8, int16, mixed, not 'int4'"):
        compile_onnx(path, "tiny", calib=calib, activations="int4")


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_int16_is_never_less_accurate_than_int8_on_the_zoo(tmp_path, name):
    """The same calibration, the same held-out inputs: the least cosine against onnxruntime float
    with int16 activations is at least that with int8 (a hair of slack: both round their weights
    to int8 alike, so int16 can tie int8 to the fourth decimal)."""
    z = zoo.ZOO[name]()
    path = tmp_path / f"{name}.onnx"
    onnx.save(z.model, str(path))
    batch = z.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value or 1
    xs = [z.test[i : i + batch] for i in range(0, len(z.test) - batch + 1, batch)]
    want = [ort_outputs(z.model, x) for x in xs]
    worst = {}
    for act in ("int8", "int16"):
        cm = compile_onnx(path, calib=z.calib, activations=act, accuracy_check=False)
        pairs = [(g, w) for x, ws in zip(xs, want, strict=True) for g, w in zip(cm.run(x), ws, strict=True)]
        worst[act] = min(cosine(g, w) for g, w in pairs)
    assert worst["int16"] >= worst["int8"] - 1e-5, worst


def test_opset21_conversion_once_per_model(monkeypatch):
    """int16 quantisation needs opset 21: a model below it is converted once, not on every call of
    the int8/int16 choice, and the quantised models are those onnxruntime's own conversion gives."""
    import onnx.version_converter

    from npu.compiler import quantize

    z = zoo.inception_small()
    assert z.model.opset_import[0].version < 21
    quantize._opset21.clear()
    quantize._memo.clear()
    calls = []
    real = onnx.version_converter.convert_version
    monkeypatch.setattr(onnx.version_converter, "convert_version", lambda m, v: calls.append(v) or real(m, v))
    firsts = []
    for int16 in (set(), {"never-a-tensor"}):
        q = quantize.quantize_float_model(z.model, z.calib, activations="mixed", int16=int16)
        firsts.append(q)
        assert max(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")) >= 21
    assert calls == [21]
    # the same model quantised with onnxruntime converting it itself (no pre-converted copy)
    quantize._memo.clear()
    monkeypatch.setattr(quantize, "_at_opset21", lambda model, src, dst: src)
    again = quantize.quantize_float_model(z.model, z.calib, activations="mixed", int16=set())
    assert again.SerializeToString() == firsts[0].SerializeToString()
