"""Two convolutions of one input whose results only their Add reads - the two layers of an int16-weight
layer (compiler/wide_weights.py) - run as one operator (compiler/ops/conv.py `paired_conv`,
compiler/spatial.py `SecondConv`): each band's input is loaded once, the second's tile is
requantised on chip and the Add is the output pass's VADD, so neither result goes through DRAM.
Bit for bit the program that runs them apart, exact against onnxruntime's QDQ model."""

import dataclasses

import numpy as np
import pytest

from npu.compiler import spatial
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


def _net(kind: str) -> tuple[Net, object]:
    """A float model whose convolutions int16 weights split (`kind`: "plain" 3 x 3; "depthwise";
    "strided": a 3-channel stride-2 input convolution, whose taps fold into k; "relu": a Relu after
    the layer, folded into the Add; "wide" and "wide-depthwise": 64 channels at 16 x 16, whose two
    weight blocks `ulx3s` splits into several output tiles)."""
    if kind == "strided":
        net = Net("pair", (1, 3, 20, 20), seed=4)
        y = net.conv(net.input, 8, 3, stride=2, pad=1, relu=False)
    elif kind.startswith("wide"):
        net = Net("pair", (1, 64, 16, 16), seed=4)
        y = net.conv(net.input, 64, 3, pad=1, groups=64 if kind == "wide-depthwise" else 1, relu=False)
    else:
        net = Net("pair", (1, 16, 12, 12), seed=4)
        groups = 16 if kind == "depthwise" else 1
        y = net.conv(net.input, 16, 3, pad=1, groups=groups, relu=kind == "relu")
    return net, net.model([net.conv(y, 8, 1, pad=0, relu=False)])


def _paired(cm) -> list[str]:
    """The second layers of pairs (lowered as views of their pair's operator)."""
    return [la.node for la in cm.lowered.layers if la.op == "Conv" and la.placement == "view"]


@pytest.mark.parametrize(
    ("kind", "config", "activations"),
    [
        ("plain", "default", "int16"),
        ("depthwise", "ulx3s", "int16"),
        ("strided", "ulx3s", "int16"),
        ("relu", "banked", "int8"),
        ("plain", "tiny", "int8"),
        ("wide", "ulx3s", "int16"),
        ("wide-depthwise", "ulx3s", "int16"),
    ],
)
def test_an_int16_weight_layer_runs_as_one_operator(tmp_path, monkeypatch, kind, config, activations):
    net, model = _net(kind)
    calib = calib_for(net.shapes[net.input])
    x = np.random.default_rng(6).normal(0, 1, net.shapes[net.input]).astype(np.float32)
    opts = dict(activations=activations, weight_precision="int16", accuracy_check=False)
    cm = compile_model(tmp_path, model, config, calib, name="pair", **opts)
    # both convolutions split; each pair one operator: its second layer and its Add are views
    assert len(_paired(cm)) == 2, [(la.node, la.op, la.placement) for la in cm.lowered.layers]
    assert not any(la.op == "Add" and la.placement != "view" for la in cm.lowered.layers)
    if kind.startswith("wide"):  # the pair's operator is tiled: several output tiles or input chunks
        split = next(la.split for la in cm.lowered.layers if la.op == "Conv" and la.placement == "npu")
        assert "beside it" in split and ("channel x" in split or "height x" in split), split
    compare_int8(cm, x)
    monkeypatch.setattr(conv_ops, "paired_conv", lambda *_a: None)
    apart = compile_model(tmp_path, model, config, calib, name="apart", **opts)
    assert not _paired(apart)
    assert_same_int8(cm, apart, x)
    assert dram_bytes(cm, config) < dram_bytes(apart, config)


def test_a_pair_the_planner_estimates_slower_runs_apart(tmp_path, monkeypatch):
    """The pair is taken only where the planner's estimate for it is at most the two apart (plus the
    band each drains or fills at their boundary): with the pair's estimate made ten times worse,
    both layers run apart, exact."""
    net, model = _net("plain")
    calib = calib_for(net.shapes[net.input])
    real = spatial.plan_conv

    def slower_pairs(*args, **kw):
        p = real(*args, **kw)
        return dataclasses.replace(p, est_cycles=10 * p.est_cycles) if kw.get("pair") else p

    monkeypatch.setattr(spatial, "plan_conv", slower_pairs)
    cm = compile_model(tmp_path, model, "default", calib, weight_precision="int16", accuracy_check=False)
    assert not _paired(cm)
    compare_int8(cm, calib[:1])
    monkeypatch.setattr(conv_ops, "PAIR_BY_ESTIMATE", False)  # the guard off: the pairs again
    assert len(_paired(compile_model(tmp_path, model, "default", calib, name="on", weight_precision="int16",
                                     accuracy_check=False))) == 2  # fmt: skip


def test_a_pair_that_does_not_fit_side_by_side_runs_apart(tmp_path, monkeypatch):
    """Where no tiling holds both (`_pair_plan` finds none) the second stores its result and the
    first adds it as a residual: still exact."""
    net, model = _net("plain")
    calib = calib_for(net.shapes[net.input])
    monkeypatch.setattr(conv_ops, "_pair_plan", lambda *_a: None)
    cm = compile_model(tmp_path, model, "default", calib, weight_precision="int16", accuracy_check=False)
    assert not _paired(cm)
    assert not any(la.op == "Add" and la.placement != "view" for la in cm.lowered.layers)  # residuals
    compare_int8(cm, calib[:1])


def test_a_result_that_is_also_a_graph_output_is_stored(tmp_path):
    """The first convolution's result is a graph output too: it must be stored as it is, so the two
    run apart (the second adds it as a residual); every output exact."""
    net = Net("out", (1, 8, 8, 8), seed=6)
    a = net.conv(net.input, 8, 3, pad=1, relu=False)
    b = net.conv(net.input, 8, 3, pad=1, relu=False)
    model = net.model([net.add(a, b), a])
    calib = calib_for(net.shapes[net.input])
    cm = compile_model(tmp_path, model, "default", calib, name="out")
    assert not _paired(cm)
    compare_int8(cm, calib[:1])


def test_three_convolutions_summed_pair_the_first_two(tmp_path):
    """A Sum of three convolutions of one input (a chain of two Adds): the first two are a pair,
    the third adds the pair's sum as a residual; exact."""
    net = Net("sum3", (1, 8, 8, 8), seed=5)
    cs = [net.conv(net.input, 8, 3, pad=1, relu=False) for _ in range(3)]
    model = net.model([net.relu(net.add(net.add(cs[0], cs[1]), cs[2]))])
    calib = calib_for(net.shapes[net.input])
    cm = compile_model(tmp_path, model, "default", calib, name="sum3")
    assert len(_paired(cm)) == 1
    compare_int8(cm, calib[:1])
    compare_int8(cm, calib[1:2])


def test_paused_at_every_point_of_a_pair(tmp_path):
    """An int16-weight layer over several bands with a point between every two: paused at each, an
    urgent model run, resumed - the same bits as the run without pauses."""
    net = Net("pts", (1, 32, 24, 24), seed=2)
    model = net.model([net.conv(net.input, 32, 3, pad=1, relu=True)])
    calib = calib_for(net.shapes[net.input])
    x = np.random.default_rng(7).normal(0, 1, net.shapes[net.input]).astype(np.float32)
    opts = dict(activations="int16", weight_precision="int16", accuracy_check=False)
    cm = compile_model(tmp_path, model, "default", calib, name="plain", **opts)
    low = compile_model(tmp_path, model, "default", calib, name="pts", cp_interval=800, **opts)
    assert _paired(low) and len(low.lowered.points) > 3
    assert_pauses_bit_exact(low, cm, x)
