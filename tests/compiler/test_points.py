"""Cancellation point placement: exact live ranges (a pause, a scrambled chip and a restore of only
the live ranges still give bit-identical outputs) and the --cp-interval bound."""

import numpy as np
import pytest

from npu.compiler import compile_onnx
from npu.executor import HostSteps, run_segments
from npu.models import zoo
from npu.models.builder import Net
from npu.registers import Status
from npu.sim.golden.model import NpuModel


class ScramblingDevice:
    """Pauses at every cancellation point, saves the point's live ranges, overwrites the whole
    scratchpad and accumulators with noise, restores the saved ranges and resumes."""

    def __init__(self, model: NpuModel, points: dict[int, dict], seed: int = 0):
        self.m, self.points, self.rng = model, points, np.random.default_rng(seed)
        self.stops: list[int] = []

    def write_dram(self, addr, data):
        self.m.write_dram(addr, data)

    def read_dram(self, addr, n):
        return self.m.read_dram(addr, n)

    def run_segment(self, pc):
        m = self.m
        m.start(pc=pc, pause=True)
        while (st := m.run()) == Status.PAUSED:
            self.stops.append(m.cp_id)
            saved = [(s, m.chip.read(s, e - s)) for s, e in self.points[m.cp_id].live_ranges]
            m.chip.spad[:] = self.rng.integers(0, 256, m.chip.spad.size, dtype=np.uint8)
            m.chip.acc[:] = self.rng.integers(0, 256, m.chip.acc.size, dtype=np.uint8)
            for s, data in saved:
                m.chip.write(s, data)
            m.start(pc=m.resume_pc, pause=True)
        assert st == Status.DONE, (st, m.error_code)


def run_scrambled(cm, x):
    c = cm.to_container()
    m = NpuModel(cm.cfg)
    for seg in c.manifest.dram:
        m.write_dram(seg.addr, c.blobs[seg.blob])
    m.load_program(c.blobs["program"], c.manifest.program.base)
    dev = ScramblingDevice(m, {p.id: p for p in c.manifest.cancel_points})
    outs = run_segments(c.manifest, HostSteps(c.blobs, c.manifest.segments), dev, [x], int8=True)
    return outs, dev.stops


@pytest.mark.parametrize("config,size", [("tiny", 24), ("default", 64)])
def test_pausing_at_every_point_with_a_scrambled_chip_is_bit_exact(tmp_path, config, size):
    net = Net("p", (1, 8, size, size), seed=3)
    h = net.conv(net.input, 16, 3)
    h = net.maxpool(h, 2, 2)
    h = net.conv(h, 32, 3)
    y = net.gemm(net.flatten(net.gap(h)), 10)
    import onnx

    onnx.save(net.model([y]), str(tmp_path / "p.onnx"))
    calib = np.random.default_rng(0).normal(size=(8, 8, size, size)).astype(np.float32)
    cm = compile_onnx(tmp_path / "p.onnx", config, calib=calib, cp_interval=1500, cp_max_live=1 << 20)
    pts = cm.lowered.points
    interior = [p for p in pts if p.kind == "interval"]
    assert interior and any(p.live_bytes > 0 for p in interior)
    x = np.random.default_rng(1).normal(size=(1, 8, size, size)).astype(np.float32)
    want = cm.run_int8(x)
    got, stops = run_scrambled(cm, x)
    assert stops == [p.id for p in pts]
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_cp_interval_bounds_the_estimated_gap(tmp_path):
    z = zoo.perception()
    import onnx

    onnx.save(z.model, str(tmp_path / "perc.onnx"))
    spill = compile_onnx(tmp_path / "perc.onnx", calib=z.calib, order="default")
    assert all(p.kind == "spill" and p.live_bytes == 0 for p in spill.lowered.points)
    gaps_spill = _gaps(spill.lowered.points)
    interval = 10_000
    cm = compile_onnx(tmp_path / "perc.onnx", calib=z.calib, order="default", cp_interval=interval)
    pts = cm.lowered.points
    gaps = _gaps(pts)
    assert len(pts) > len(spill.lowered.points)
    assert max(gaps) < max(gaps_spill)
    # a gap above the interval has no usable candidate inside it (one indivisible step)
    max_live = cm.cfg.spad_bytes // 4
    for a, b in zip(pts, pts[1:], strict=False):
        if a.segment == b.segment and b.est_cycles - a.est_cycles > interval:
            inside = [
                c
                for c in cm.lowered.candidates
                if c["segment"] == a.segment
                and a.est_cycles < c["est_cycles"] < b.est_cycles
                and c["live_bytes"] <= max_live
            ]
            assert not inside, (a, b, inside[:3])
    # a tight live-data budget skips the points that would dump the resident weights
    tight = compile_onnx(
        tmp_path / "perc.onnx", calib=z.calib, order="default", cp_interval=interval, cp_max_live=0
    )
    assert all(p.live_bytes == 0 for p in tight.lowered.points)
    assert len(tight.lowered.points) < len(pts)
    assert "interval points" in cm.report()


def _gaps(points):
    ts = [p.est_cycles for p in points]
    return [b - a for a, b in zip([0] + ts, ts, strict=False) if b >= a]
