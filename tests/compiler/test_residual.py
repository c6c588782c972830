"""An Add of a convolution's result and an activation computed before it (a residual) done in the
convolution's output pass (compiler/ops/conv.py, `residual_add`): the other operand's tile is
loaded beside each output tile and one VADD makes the Add's output, which is what is stored.
Exact against onnxruntime's QDQ model and bit for bit the separate Add's results."""

import numpy as np
import pytest

from npu.compiler.ops import conv as conv_ops
from npu.models.builder import Net
from tests.compiler.helpers import assert_pauses_bit_exact, assert_same_int8, compare_int8, compile_model
from tests.compiler.test_operators import calib_for


def residual_net(kind: str, shape=(1, 16, 8, 8)) -> tuple[Net, object]:
    """conv -> conv -> Add with the first conv's result (`kind`: "plain"; "first": the conv the
    Add's first operand; "silu": a SiLU on the second conv before the Add; "relu": a Relu after the
    Add; "shared": the second conv's result read by another node too, so it must be stored)."""
    net = Net("res", shape, seed=3)
    c = shape[1]
    a = net.conv(net.input, c, 3, pad=1, relu=True)
    b = net.conv(a, c, 3, pad=1, relu=False)
    if kind == "silu":
        b = net.node("Mul", [b, net.node("Sigmoid", [b], net.shapes[b])], net.shapes[b])
    y = net.add(b, a) if kind == "first" else net.add(a, b)
    if kind == "relu":
        y = net.relu(y)
    outs = [y, net.conv(b, 4, 1, pad=0, relu=False)] if kind == "shared" else [y]
    return net, net.model(outs)


def _fused(cm) -> list[str]:
    return [la.node for la in cm.lowered.layers if la.op == "Add" and la.placement == "view"]


def _est(cm) -> int:
    return sum(la.est_cycles or 0 for la in cm.lowered.layers if la.placement == "npu")


@pytest.mark.parametrize(
    ("kind", "config", "activations"),
    [
        ("plain", "default", "int8"),
        ("first", "default", "int16"),
        ("relu", "default", "int16"),
        ("plain", "tiny", "int8"),
        ("relu", "banked", "int16"),
    ],
)
def test_residual_add_in_the_output_pass(tmp_path, monkeypatch, kind, config, activations):
    net, model = residual_net(kind)
    calib = calib_for(net.shapes[net.input])
    x = np.random.default_rng(5).normal(0, 1, net.shapes[net.input]).astype(np.float32)
    cm = compile_model(tmp_path, model, config, calib, name="fused", activations=activations)
    assert _fused(cm), [(la.node, la.op, la.placement) for la in cm.lowered.layers]
    assert not any(la.op == "Add" and la.placement != "view" for la in cm.lowered.layers)
    compare_int8(cm, x)
    monkeypatch.setattr(conv_ops, "residual_add", lambda *_a: None)
    apart = compile_model(tmp_path, model, config, calib, name="apart", activations=activations)
    assert not _fused(apart)
    assert_same_int8(cm, apart, x)
    if config == "default":
        assert _est(cm) < _est(apart), (_est(cm), _est(apart))


@pytest.mark.parametrize("kind", ["shared", "silu"])
def test_a_result_read_elsewhere_or_through_a_function_is_added_apart(tmp_path, kind):
    """A result another node reads too must be stored as it is; after a function in the output pass
    (a SiLU) the Add keeps its own pass (the band's longer tail, drained at each point, cost more
    on real models)."""
    net, model = residual_net(kind)
    calib = calib_for(net.shapes[net.input])
    cm = compile_model(tmp_path, model, "default", calib)
    assert not _fused(cm)
    assert any(la.op == "Add" and la.placement == "npu" for la in cm.lowered.layers)
    compare_int8(cm, calib[:1])


def test_paused_at_every_point_of_a_fused_residual(tmp_path):
    """A residual over a map of several bands with a point between every two: paused at each, an
    urgent model run, resumed - the same bits as the run without pauses."""
    net, model = residual_net("relu", shape=(1, 32, 24, 24))
    calib = calib_for(net.shapes[net.input])
    x = np.random.default_rng(7).normal(0, 1, net.shapes[net.input]).astype(np.float32)
    cm = compile_model(tmp_path, model, "default", calib, name="plain", activations="int16")
    low = compile_model(tmp_path, model, "default", calib, name="pts", activations="int16", cp_interval=800)
    assert _fused(low) and len(low.lowered.points) > 3
    assert_pauses_bit_exact(low, cm, x)


@pytest.mark.parametrize("order", ["search", "default"])
def test_a_chain_of_residuals_reads_each_sum_after_it_is_made(tmp_path, monkeypatch, order):
    """Three convolutions summed (a Sum, a chain of two Adds): the second convolution makes the first
    sum, the third reads it - lowered before the first Add's own node, so its fragment must depend
    on the second convolution's. Exact against onnxruntime and the unfused program, any order."""
    net = Net("chain", (1, 8, 8, 8), seed=5)
    cs = [net.conv(net.input, 8, 3, pad=1, relu=False) for _ in range(3)]
    y = net.relu(net.add(net.add(cs[0], cs[1]), cs[2]))
    model = net.model([y])
    calib = calib_for(net.shapes[net.input])
    x = np.random.default_rng(3).normal(0, 1, net.shapes[net.input]).astype(np.float32)
    cm = compile_model(tmp_path, model, "default", calib, name="chain", order=order)
    assert len(_fused(cm)) == 2
    compare_int8(cm, x)
    monkeypatch.setattr(conv_ops, "residual_add", lambda *_a: None)
    apart = compile_model(tmp_path, model, "default", calib, name="apart", order=order)
    assert_same_int8(cm, apart, x)
