"""A strided depthwise convolution's band may keep its rows and columns in phases by the stride
(compiler/spatial.py `BandPixels.phased`): each tap then reads consecutive output rows from
consecutive rows of one plane, so one MATMUL a tap covers the band instead of one a tap and output
row. Bit for bit the program with per-row MATMULs, exact against onnxruntime's QDQ model, with
fewer MATMULs."""

import numpy as np
import pytest

from npu.compiler import spatial
from npu.isa import Opcode
from npu.models.builder import Net
from tests.compiler.helpers import assert_same_int8, compare_int8, compile_model
from tests.compiler.test_operators import calib_for

TILINGS = spatial._tilings


def _only(phased: bool):
    """The planner's tilings with the band's rows in phases (or never)."""

    def pick(*args, **kw):
        out = TILINGS(*args, **kw)
        kept = [t for t in out if t[1].phased == phased]
        return kept or out

    return pick


def _matmuls(cm) -> int:
    lo, hi = cm.lowered.layers[0].pc
    return sum(i.op == Opcode.MATMUL for i in cm.lowered.program[lo:hi])


@pytest.mark.parametrize(
    ("config", "activations", "shape", "kernel", "stride", "pad"),
    [
        ("ulx3s32", "int16", (1, 32, 13, 15), 3, 2, 1),  # odd sizes: planes of unequal heights
        ("ulx3s32", "int8", (1, 32, 12, 12), 3, 2, 0),
        ("default", "int8", (1, 64, 14, 11), 5, 2, 2),  # two rows and columns of taps a phase
        ("tiny", "int8", (1, 16, 10, 10), 3, 3, 1),  # nine phases
        ("ulx3s128", "int16", (1, 32, 16, 16), 3, 2, 1),
    ],
)
def test_phased_bands_are_bit_exact_with_fewer_matmuls(tmp_path, monkeypatch, config, activations, shape,
                                                       kernel, stride, pad):  # fmt: skip
    net = Net("phased", shape, seed=4)
    c = shape[1]
    y = net.conv(net.input, c, kernel, stride=stride, pad=pad, groups=c)
    model = net.model([net.conv(y, 8, 1, pad=0, relu=False)])
    calib = calib_for(shape)
    x = np.random.default_rng(6).normal(0, 1, shape).astype(np.float32)
    opts = dict(activations=activations, accuracy_check=False, cancel_points=False)
    monkeypatch.setattr(spatial, "_tilings", _only(True))
    cm = compile_model(tmp_path, model, config, calib, name="phased", **opts)
    split = cm.lowered.layers[0].split
    assert f"band rows and columns in {stride} x {stride} phases" in split, split
    compare_int8(cm, x)
    monkeypatch.setattr(spatial, "_tilings", _only(False))
    rows = compile_model(tmp_path, model, config, calib, name="rows", **opts)
    assert "phases" not in rows.lowered.layers[0].split
    assert_same_int8(cm, rows, x)
    assert _matmuls(cm) < _matmuls(rows), (_matmuls(cm), _matmuls(rows))


def test_phases_need_the_same_stride_both_ways_and_a_tap_in_each():
    g = spatial.Geometry(1, 12, 12, 6, 6, 3, 3, 2, 2, 1, 1, 0, 0)
    assert spatial.phases(g)
    assert not spatial.phases(spatial.Geometry(1, 12, 12, 12, 12, 3, 3, 1, 1, 1, 1, 1, 1))  # stride 1
    assert not spatial.phases(spatial.Geometry(1, 12, 12, 6, 6, 1, 1, 2, 2, 0, 0, 0, 0))  # 1 x 1: one phase
    assert not spatial.phases(spatial.Geometry(1, 12, 12, 6, 12, 3, 3, 2, 1, 1, 1, 0, 1))  # 2 x 1
    assert not spatial.phases(spatial.Geometry(1, 12, 12, 4, 4, 3, 3, 2, 2, 0, 0, 0, 0, 2, 2))  # dilated


def test_the_planner_takes_phases_for_mobilenets_strided_depthwise_layers(tmp_path):
    """MobileNet's 3 x 3 stride-2 depthwise layer of 64 int16 channels at 24 x 24 on the 32-MAC
    ULX3S: phased bands by the planner's choice, and fewer cycles than with per-row MATMULs."""
    net = Net("mbdw", (1, 64, 24, 24), seed=2)
    model = net.model([net.conv(net.input, 64, 3, stride=2, pad=1, groups=64, relu=False)])
    calib = calib_for(net.shapes[net.input])
    opts = dict(activations="int16", accuracy_check=False, cancel_points=False)
    cm = compile_model(tmp_path, model, "ulx3s32", calib, name="auto", **opts)
    assert "phases" in cm.lowered.layers[0].split, cm.lowered.layers[0].split
    try:
        spatial._tilings = _only(False)
        rows = compile_model(tmp_path, model, "ulx3s32", calib, name="rows", **opts)
    finally:
        spatial._tilings = TILINGS
    assert cm._npu_cycles() < rows._npu_cycles(), (cm._npu_cycles(), rows._npu_cycles())


def test_phases_do_not_depend_on_the_narrow_depthwise_option(tmp_path):
    """`--no-narrow-depthwise` (one MATMUL a chunk, the compile's retry where a program does not fit
    its DRAM) keeps the phases, which make fewer MATMULs too."""
    net = Net("mbdw", (1, 64, 24, 24), seed=2)
    model = net.model([net.conv(net.input, 64, 3, stride=2, pad=1, groups=64, relu=False)])
    opts = dict(activations="int16", accuracy_check=False, cancel_points=False, narrow_depthwise=False)
    cm = compile_model(tmp_path, model, "ulx3s32", calib_for(net.shapes[net.input]), **opts)
    assert "phases" in cm.lowered.layers[0].split, cm.lowered.layers[0].split
