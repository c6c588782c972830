"""A depthwise convolution and the 1 x 1 convolution that alone reads its result run as one
operator (compiler/pointwise.py): each band's depthwise tile is requantised on chip and the 1 x 1
layer's MATMUL reads it there, so the depthwise result never goes through DRAM. Bit for bit the
program that runs them apart, exact against onnxruntime's QDQ model."""

import numpy as np
import pytest

from npu.compiler import pointwise
from npu.compiler.ops import conv as conv_ops
from npu.models.builder import Net
from tests.compiler.helpers import (
    assert_pauses_bit_exact,
    assert_same_int8,
    compare_int8,
    compile_model,
    dram_bytes,
)
from tests.compiler.test_operators import calib_for


def _net(kind: str, c: int = 16, hw: int = 12) -> Net:
    """Two depthwise + 1 x 1 blocks (`kind`: "plain"; "strided": the first depthwise of stride 2;
    "narrow": a map 5 pixels wide, whose bands hold pixel slots past the width; "batch": two frames;
    "wide": 64 channels at 16 x 16, which the smaller presets split into several bands)."""
    shapes = {"narrow": (1, c, 13, 5), "batch": (2, c, hw, hw), "wide": (1, 64, 16, 16)}
    shape = shapes.get(kind, (1, c, hw, hw))
    net = Net("dwpw", shape, seed=3)
    ch = shape[1]
    y = net.conv(net.input, ch, 3, stride=2 if kind == "strided" else 1, pad=1, groups=ch, relu=True)
    y = net.conv(y, 2 * ch, 1, pad=0, relu=True)
    y = net.conv(y, 2 * ch, 3, pad=1, groups=2 * ch, relu=True)
    return net, net.model([net.conv(y, ch, 1, pad=0, relu=False)])


def _fused(cm) -> list[str]:
    """The 1 x 1 layers computed by the depthwise operator before them (views of it)."""
    return [la.node for la in cm.lowered.layers if la.op == "Conv" and la.placement == "view"]


@pytest.mark.parametrize(
    ("kind", "config", "activations", "reuse"),
    [
        ("plain", "default", "int8", None),
        ("plain", "ulx3s32", "int16", False),
        ("plain", "ulx3s32", "int16", True),
        ("strided", "ulx3s32", "int16", None),
        ("strided", "default", "int8", True),
        ("narrow", "ulx3s", "int16", False),
        ("narrow", "ulx3s128", "int8", True),
        ("batch", "banked", "int8", None),
        ("wide", "default", "int16", True),
        ("wide", "ulx3s128", "int16", False),
        ("plain", "tiny", "int8", None),
    ],
)
def test_depthwise_and_pointwise_run_as_one_operator(tmp_path, monkeypatch, kind, config, activations, reuse):
    """`reuse`: the 1 x 1 layer's accumulators in the depthwise tiles (True), a tile of their own
    (False), or whichever the estimate prefers (None)."""
    net, model = _net(kind)
    calib = calib_for(net.shapes[net.input])
    x = np.random.default_rng(6).normal(0, 1, net.shapes[net.input]).astype(np.float32)
    opts = dict(activations=activations, accuracy_check=False, output_precision="int8")
    monkeypatch.setattr(conv_ops, "FUSE_BY_ESTIMATE", False)  # wherever it fits: the values are the point
    if reuse is not None:
        real = pointwise.reserve
        monkeypatch.setattr(pointwise, "reserve", lambda *a: real(*a) if a[-1] == reuse else None)
    cm = compile_model(tmp_path, model, config, calib, name="fused", **opts)
    # in the depthwise tiles only where its rows are no wider: the first block doubles the channels
    layers = [(la.node, la.op, la.placement, la.split) for la in cm.lowered.layers]
    assert len(_fused(cm)) == (1 if reuse else 2), layers
    if kind == "wide":  # several bands, each ending with its 1 x 1 layer
        split = next(la.split for la in cm.lowered.layers if "(1 x 1) on each band" in la.split)
        assert "height x" in split, split
    compare_int8(cm, x)
    monkeypatch.setattr(conv_ops, "FUSE_POINTWISE", False)
    apart = compile_model(tmp_path, model, config, calib, name="apart", **opts)
    assert not _fused(apart)
    assert_same_int8(cm, apart, x)
    assert dram_bytes(cm, config) < dram_bytes(apart, config)


def test_one_operator_the_planner_estimates_slower_runs_apart(tmp_path, monkeypatch):
    """The two run as one only where the planner's estimate for that is below the two apart: with
    the 1 x 1 layer's cycles in the estimate made a thousand times larger, they run apart, exact."""
    net, model = _net("plain")
    calib = calib_for(net.shapes[net.input])
    real = pointwise.cycles
    monkeypatch.setattr(pointwise, "cycles", lambda *a: 1000 * real(*a))
    cm = compile_model(tmp_path, model, "ulx3s32", calib, accuracy_check=False)
    assert not _fused(cm)
    compare_int8(cm, calib[:1])


def test_a_cancellation_interval_its_bands_exceed_runs_apart(tmp_path, monkeypatch):
    """A band of the one operator holds both layers' work: where that is longer than the
    cancellation interval allows, the two run apart (each band within it), exact."""
    monkeypatch.setattr(conv_ops, "FUSE_BY_ESTIMATE", False)
    net, model = _net("wide")
    calib = calib_for(net.shapes[net.input])
    opts = dict(activations="int16", accuracy_check=False, output_precision="int8")
    short = compile_model(tmp_path, model, "default", calib, name="s", cp_interval=2000, **opts)
    assert not _fused(short)
    assert _fused(compile_model(tmp_path, model, "default", calib, name="l", cp_interval=16000, **opts))
    compare_int8(short, calib[:1])


def test_a_map_of_one_band_runs_apart(tmp_path, monkeypatch):
    """Where the one operator would run a single band, neither layer's work runs under the other's:
    the two run apart (with the estimate's guard off, as one; exact either way)."""
    net = Net("small", (1, 64, 3, 3), seed=6)
    d = net.conv(net.input, 64, 3, pad=1, groups=64, relu=True)
    model = net.model([net.conv(d, 64, 1, pad=0, relu=True)])
    calib = calib_for(net.shapes[net.input])
    opts = dict(accuracy_check=False, output_precision="int8")
    cm = compile_model(tmp_path, model, "default", calib, name="one", **opts)
    assert not _fused(cm)
    monkeypatch.setattr(conv_ops, "FUSE_BY_ESTIMATE", False)
    on = compile_model(tmp_path, model, "default", calib, name="on", **opts)
    assert _fused(on) and "height x" not in on.lowered.layers[0].split
    assert_same_int8(cm, on, calib[:1])


def _depthwise(name: str) -> tuple[Net, str]:
    """A 16-channel 8 x 8 input and its 3 x 3 depthwise convolution (with a Relu)."""
    net = Net(name, (1, 16, 8, 8), seed=6)
    return net, net.conv(net.input, 16, 3, pad=1, groups=16, relu=True)


def _assert_apart(tmp_path, net: Net, outputs: list[str]) -> None:
    """Compiled for `default`, no 1 x 1 layer runs inside a depthwise operator; exact."""
    calib = calib_for(net.shapes[net.input])
    cm = compile_model(tmp_path, net.model(outputs), "default", calib, name=net.name, accuracy_check=False)
    assert not _fused(cm)
    compare_int8(cm, calib[:1])


def test_a_depthwise_result_that_is_also_read_elsewhere_is_stored(tmp_path, monkeypatch):
    """The depthwise result is a graph output too, or read by a 3 x 3 convolution as well: it
    must be stored, so the two run apart; every output exact."""
    monkeypatch.setattr(conv_ops, "FUSE_BY_ESTIMATE", False)
    net, d = _depthwise("out")
    _assert_apart(tmp_path, net, [net.conv(d, 16, 1, pad=0, relu=False), d])
    net, d = _depthwise("two")
    a, b = net.conv(d, 16, 1, pad=0, relu=False), net.conv(d, 16, 3, pad=1, relu=False)
    _assert_apart(tmp_path, net, [net.add(a, b)])


def test_a_pointwise_layer_with_an_output_pass_of_its_own_runs_apart(tmp_path, monkeypatch):
    """A 1 x 1 layer whose result a residual Add or a table function reads takes that in its own
    output pass, so it is not computed by the depthwise operator; exact either way."""
    monkeypatch.setattr(conv_ops, "FUSE_BY_ESTIMATE", False)
    net, d = _depthwise("res")
    _assert_apart(tmp_path, net, [net.add(net.conv(d, 16, 1, pad=0, relu=False), net.input)])
    net, d = _depthwise("sig")
    pw = net.conv(d, 16, 1, pad=0, relu=False)
    _assert_apart(tmp_path, net, [net.node("Sigmoid", [pw], net.shapes[pw])])


def test_paused_at_every_point_of_one_operator(tmp_path, monkeypatch):
    """Depthwise and 1 x 1 as one operator over several bands with a point between every two (each
    band's 1 x 1 layer runs after the next band's depthwise MATMULs, so a point holds a band's
    requantised tile): paused at each, an urgent model run, resumed - the same bits as without."""
    monkeypatch.setattr(conv_ops, "FUSE_BY_ESTIMATE", False)
    net, model = _net("wide")
    calib = calib_for(net.shapes[net.input])
    x = np.random.default_rng(7).normal(0, 1, net.shapes[net.input]).astype(np.float32)
    opts = dict(activations="int16", accuracy_check=False, output_precision="int8")
    cm = compile_model(tmp_path, model, "default", calib, name="plain", **opts)
    # an interval its bands fit in (with a shorter one the operator runs apart: its bands, both
    # layers', would hold a pause longer than the interval)
    low = compile_model(tmp_path, model, "default", calib, name="pts", cp_interval=16000, **opts)
    assert _fused(low) and len(low.lowered.points) > 3
    assert_pauses_bit_exact(low, cm, x)
