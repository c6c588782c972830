"""A convolution's input band on a banked scratchpad with several clusters keeps each pixel at a pitch
off the banks' period (npu/timing.py `a_pitch`, compiler/spatial.py): the clusters read the A rows
of neighbouring pixels in one step, and an int16 map's pitch in DRAM is always an even number of
lane words, which put them in one bank of two. Bit for bit the program with the band at the
tensor's pitch, exact against onnxruntime's QDQ model, and in fewer matrix cycles."""

import numpy as np
import pytest

from npu.arith import cdiv
from npu.compiler import spatial
from npu.config import get_config
from npu.isa import Opcode
from npu.models.builder import Net
from npu.sim.golden.runner import timing_run
from npu.timing import a_pitch, banked_matmul_steps, matmul_k_steps
from tests.compiler.helpers import compare_int8, compile_model
from tests.compiler.test_operators import calib_for


def _net(kind: str):
    """"plain": 3 x 3 of 16 channels; "depthwise"; "wide": 64 channels at 16 x 16 (several output
    tiles or input chunks); "grouped": 4 groups (bands of a tile's window of channels)."""
    if kind == "wide":
        net = Net("pitch", (1, 64, 16, 16), seed=3)
        y = net.conv(net.input, 64, 3, pad=1)
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


def test_the_pitch_is_off_the_banks_period():
    cfg = get_config("ulx3s32")  # two clusters, two banks a region
    assert a_pitch(cfg, 16, 2) == 20  # 4 lane words -> 5
    assert a_pitch(cfg, 16, 1) == 24  # 2 -> 3
    assert a_pitch(cfg, 24, 1) == 24  # already odd
    assert a_pitch(cfg, 16, 2, stride=2) == 16  # two pixels apart: no pitch helps with two banks
    assert a_pitch(get_config("ulx3s128"), 16, 2, stride=2) == 20  # four banks: two a bank, not four
    for one in ("ulx3s", "default", "tiny"):  # one cluster, or not banked: the tensor's pitch
        assert a_pitch(get_config(one), 16, 2) == 16


@pytest.mark.parametrize(
    ("kind", "config", "activations"),
    [
        ("plain", "ulx3s32", "int16"),
        ("plain", "ulx3s32", "int8"),
        ("depthwise", "ulx3s32", "int16"),
        ("grouped", "ulx3s32", "int16"),
        ("wide", "ulx3s32", "int16"),
        ("plain", "ulx3s128", "int16"),
    ],
)
def test_a_padded_band_is_bit_exact_and_conflict_free(tmp_path, monkeypatch, kind, config, activations):
    net, model = _net(kind)
    calib = calib_for(net.shapes[net.input])
    x = np.random.default_rng(5).normal(0, 1, net.shapes[net.input]).astype(np.float32)
    opts = dict(activations=activations, accuracy_check=False)
    cm = compile_model(tmp_path, model, config, calib, name="pitch", **opts)
    compare_int8(cm, x)
    got, ideal = _conflict_steps(cm, config)
    monkeypatch.setattr(spatial, "a_pitch", lambda cfg, elems, *_a: elems)
    flat = compile_model(tmp_path, model, config, calib, name="flat", **opts)
    for a, b in zip(cm.run_int8(x), flat.run_int8(x), strict=True):
        assert np.array_equal(a, b)
    assert got == ideal, (got, ideal)  # no step waits for a bank
    flat_got, _ = _conflict_steps(flat, config)
    busy = [timing_run(config, c.lowered.program).counter_values()["BUSY_MATRIX"] for c in (cm, flat)]
    if activations == "int16":
        assert got < flat_got and busy[0] < busy[1], (got, flat_got, busy)
    else:  # an int8 map's pitch in DRAM is off the banks' period already (`bank_stride`)
        assert got == flat_got and busy[0] == busy[1], (got, flat_got, busy)
