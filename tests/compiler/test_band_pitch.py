"""A convolution's input band on a banked scratchpad with several clusters keeps each pixel at a pitch
off the banks' period (npu/timing.py `a_pitch`, compiler/spatial.py): the clusters read the A rows
of neighbouring pixels in one step, and an int16 map's pitch in DRAM is always an even number of
lane words, which put them in one bank of two. A strided convolution's band keeps each row's
columns in planes by their remainder (`a_planes`, `BandPixels`), so its MATMULs read adjacent
pixels. Bit for bit the program with the band as the tensor is, exact against onnxruntime's QDQ
model, and in fewer matrix cycles."""

import numpy as np
import pytest

from npu.arith import cdiv
from npu.compiler import spatial
from npu.config import get_config
from npu.isa import Opcode
from npu.models.builder import Net
from npu.sim.golden.runner import timing_run
from npu.timing import a_pitch, a_planes, banked_matmul_steps, matmul_k_steps
from tests.compiler.helpers import assert_same_int8, compare_int8, compile_model
from tests.compiler.test_operators import calib_for


def _net(kind: str):
    """"plain": 3 x 3 of 16 channels; "depthwise"; "wide": 64 channels at 16 x 16 (several output
    tiles or input chunks); "grouped": 4 groups (bands of a tile's window of channels); "strided": 3
    x 3 of stride 2 over an odd width, then 1 x 1 of stride 2; "strided-depthwise"."""
    if kind == "wide":
        net = Net("pitch", (1, 64, 16, 16), seed=3)
        y = net.conv(net.input, 64, 3, pad=1)
    elif kind.startswith("strided"):
        net = Net("pitch", (1, 16, 13, 15), seed=3)
        y = net.conv(net.input, 16, 3, stride=2, pad=1, groups=16 if kind.endswith("depthwise") else 1)
        y = net.conv(y, 16, 1, stride=2, pad=0)
    else:
        net = Net("pitch", (1, 16, 12, 12), seed=3)
        groups = {"depthwise": 16, "grouped": 4}.get(kind, 1)
        y = net.conv(net.input, 16, 3, pad=1, groups=groups)
    return net, net.model([net.conv(y, 8, 1, pad=0, relu=False)])


def _conflict_steps(cm, config: str) -> tuple[int, int]:
    """(matrix steps on the banks, steps without conflicts) over the program's MATMULs whose A rows
    are pixels (not a bias's, whose one A row every cluster reads: a_stride 0)."""
    cfg = get_config(config)
    got = ideal = 0
    for i in cm.lowered.program:
        f = i.fields
        if i.op != Opcode.MATMUL or f["m"] < cfg.clusters or f["a_stride"] == 0:
            continue
        got += banked_matmul_steps(f, cfg)
        ideal += cdiv(f["m"], cfg.clusters) * cdiv(f["n"], cfg.pes_per_cluster) * matmul_k_steps(f, cfg)
    return got, ideal


def _separated(tilings):
    """The planner's tilings with each band's pixels as far apart in the banks as they go (the
    planner weighs that against the DMA rows it costs)."""

    def pick(*args):
        best = {}
        for c, bp in tilings(*args):
            if c not in best or (bp.planes, bp.pitch) > (best[c].planes, best[c].pitch):
                best[c] = bp
        return list(best.items())

    return pick


def test_the_pitch_is_off_the_banks_period():
    cfg = get_config("ulx3s32")  # two clusters, two banks a region
    assert a_pitch(cfg, 16, 2) == 20  # 4 lane words -> 5
    assert a_pitch(cfg, 16, 1) == 24  # 2 -> 3
    assert a_pitch(cfg, 24, 1) == 24  # already odd
    assert a_pitch(cfg, 16, 2, stride=2) == 16  # two pixels apart: no pitch helps with two banks
    assert a_pitch(get_config("ulx3s128"), 16, 2, stride=2) == 20  # four banks: two a bank, not four
    assert a_planes(cfg, 16, 2, 2) == 2 and a_planes(cfg, 16, 2, 1) == 1  # so: columns by parity
    assert a_planes(get_config("banked"), 16, 2, 2) == 1  # five banks a half: a pitch does it
    for one in ("ulx3s", "default", "tiny"):  # one cluster, or not banked: the tensor's pitch
        assert a_pitch(get_config(one), 16, 2) == 16 and a_planes(get_config(one), 16, 2, 2) == 1


@pytest.mark.parametrize(
    ("kind", "config", "activations"),
    [
        ("plain", "ulx3s32", "int16"),
        ("plain", "ulx3s32", "int8"),
        ("depthwise", "ulx3s32", "int16"),
        ("grouped", "ulx3s32", "int16"),
        ("wide", "ulx3s32", "int16"),
        ("plain", "ulx3s128", "int16"),
        ("strided", "ulx3s32", "int16"),
        ("strided", "ulx3s32", "int8"),
        ("strided-depthwise", "ulx3s32", "int16"),
        ("strided", "ulx3s128", "int16"),
    ],
)
def test_a_padded_band_is_bit_exact_and_conflict_free(tmp_path, monkeypatch, kind, config, activations):
    net, model = _net(kind)
    calib = calib_for(net.shapes[net.input])
    x = np.random.default_rng(5).normal(0, 1, net.shapes[net.input]).astype(np.float32)
    opts = dict(activations=activations, accuracy_check=False)
    monkeypatch.setattr(spatial, "_tilings", _separated(spatial._tilings))
    cm = compile_model(tmp_path, model, config, calib, name="pitch", **opts)
    compare_int8(cm, x)
    got, ideal = _conflict_steps(cm, config)
    splits = [la.split for la in cm.lowered.layers if la.op == "Conv"]
    assert any("planes" in s for s in splits) == kind.startswith("strided"), splits
    monkeypatch.setattr(spatial, "a_pitch", lambda cfg, elems, *_a: elems)
    monkeypatch.setattr(spatial, "a_planes", lambda *_a: 1)
    flat = compile_model(tmp_path, model, config, calib, name="flat", **opts)
    assert_same_int8(cm, flat, x)
    assert got == ideal, (got, ideal)  # no step waits for a bank
    flat_got, _ = _conflict_steps(flat, config)
    busy = [timing_run(config, c.lowered.program).counter_values()["BUSY_MATRIX"] for c in (cm, flat)]
    if activations == "int16" or kind.startswith("strided"):
        assert got < flat_got and busy[0] < busy[1], (got, flat_got, busy)
    else:  # an int8 map's pitch in DRAM is off the banks' period already (`bank_stride`)
        assert got == flat_got and busy[0] == busy[1], (got, flat_got, busy)


def test_the_planner_takes_planes_where_they_pay(tmp_path, monkeypatch):
    """A strided band in planes loads a DMA row a pixel (a burst each on the ULX3S's 16-bit SDRAM):
    the planner takes them where its estimate, which now counts the steps a bank conflict costs,
    says they pay - a 3 x 3 stride-2 convolution of 64 int16 channels on two clusters - and the
    program is faster for it on the golden model."""
    net = Net("planes", (1, 64, 24, 24), seed=3)
    model = net.model([net.conv(net.input, 64, 3, stride=2, pad=1)])
    calib = calib_for(net.shapes[net.input])
    opts = dict(activations="int16", accuracy_check=False, cancel_points=False)
    cm = compile_model(tmp_path, model, "ulx3s32", calib, name="auto", **opts)
    split = next(la.split for la in cm.lowered.layers if la.op == "Conv")
    assert "band columns in 2 planes" in split, split
    tilings = spatial._tilings
    monkeypatch.setattr(spatial, "_tilings", lambda *a: [t for t in tilings(*a) if t[1].planes == 1])
    flat = compile_model(tmp_path, model, "ulx3s32", calib, name="flat", **opts)
    assert cm._npu_cycles() < flat._npu_cycles(), (cm._npu_cycles(), flat._npu_cycles())


def test_the_planner_takes_the_pitch_where_it_pays(tmp_path):
    """At stride 1 too the padded pitch costs a DMA row a pixel: taken for a 3 x 3 convolution of 64
    int16 channels on two clusters, whose MATMULs then read their A rows an odd number of words
    apart."""
    net = Net("pitch", (1, 64, 24, 24), seed=3)
    model = net.model([net.conv(net.input, 64, 3, pad=1)])
    opts = dict(activations="int16", accuracy_check=False, cancel_points=False)
    cm = compile_model(tmp_path, model, "ulx3s32", calib_for(net.shapes[net.input]), name="auto", **opts)
    mms = [i for i in cm.lowered.program if i.op == Opcode.MATMUL]
    strides = {i.fields["a_stride"] for i in mms if i.fields["a_stride"]}
    assert strides and all(s // 8 % 2 == 1 for s in strides), strides
    got, ideal = _conflict_steps(cm, "ulx3s32")
    assert got == ideal, (got, ideal)
