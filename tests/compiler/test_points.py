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
from npu.sim.golden.runner import run_container


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
    spill = compile_onnx(tmp_path / "perc.onnx", calib=z.calib, order="default", max_pause_us=0)
    assert all(p.kind == "spill" and p.live_bytes == 0 for p in spill.lowered.points)
    gaps_spill = _gaps(spill.lowered.points)
    interval = 10_000
    cm = compile_onnx(tmp_path / "perc.onnx", calib=z.calib, order="default", cp_interval=interval)
    pts = cm.lowered.points
    gaps = _gaps(pts)
    assert len(pts) > len(spill.lowered.points)
    assert max(gaps) < max(gaps_spill)
    # a gap above the interval has no candidate inside it (one indivisible step): the default live
    # budget is a preference, a candidate above it is taken where nothing smaller closes the gap
    for a, b in zip(pts, pts[1:], strict=False):
        if a.segment == b.segment and b.est_cycles - a.est_cycles > interval:
            inside = [
                c
                for c in cm.lowered.candidates
                if c["segment"] == a.segment and a.est_cycles < c["est_cycles"] < b.est_cycles
            ]
            assert not inside, (a, b, inside[:3])
    # a tight live-data budget skips the points that would dump the resident weights
    tight = compile_onnx(
        tmp_path / "perc.onnx", calib=z.calib, order="default", cp_interval=interval, cp_max_live=0
    )
    assert all(p.live_bytes == 0 for p in tight.lowered.points)
    assert len(tight.lowered.points) < len(pts)
    assert "interval points" in cm.report()


def test_the_default_interval_is_a_pause_budget_at_the_configurations_clock(tmp_path):
    """--max-pause-us at the preset's clock is --cp-interval in cycles (100 us at 100 MHz: 10,000
    cycles); the default budget places interval points; the report and max_cp_gap give the gap."""
    z = zoo.perception()
    import onnx

    onnx.save(z.model, str(tmp_path / "perc.onnx"))
    kw = dict(calib=z.calib, order="default")
    by_budget = compile_onnx(tmp_path / "perc.onnx", "default", max_pause_us=100, **kw)
    by_cycles = compile_onnx(tmp_path / "perc.onnx", "default", cp_interval=10_000, **kw)
    assert by_budget.lowered.program == by_cycles.lowered.program
    assert by_budget.lowered.points == by_cycles.lowered.points
    assert by_budget.max_cp_gap == max(_gaps(by_budget.lowered.points))
    assert f"largest estimated gap {by_budget.max_cp_gap} cycles" in by_budget.report()
    spill = compile_onnx(tmp_path / "perc.onnx", "default", max_pause_us=0, **kw)
    default = compile_onnx(tmp_path / "perc.onnx", "default", **kw)
    assert default.max_cp_gap <= 50_000 < spill.max_cp_gap, (default.max_cp_gap, spill.max_cp_gap)
    assert any(p.kind == "interval" for p in default.lowered.points)
    # an explicit interval wins over the budget; no points at all means no interval
    assert compile_onnx(tmp_path / "perc.onnx", "default", cp_interval=10_000, max_pause_us=1e6, **kw)\
        .lowered.points == by_cycles.lowered.points  # fmt: skip
    assert compile_onnx(tmp_path / "perc.onnx", "default", cancel_points=False, **kw).lowered.points == []


def _gaps(points):
    """The wait of a pause asked as the first thing after a point starts (a segment's start), until
    the next point's reach."""
    out, last = [], {}
    for p in points:
        out.append(p.est_cycles - last.get(p.segment, 0))
        last[p.segment] = p.est_first_start
    return out


def test_the_largest_gap_bounds_the_pause_latency_the_golden_model_measures(tmp_path):
    """Units pass a point apart (tokens may cross it): a pause asked as the first instruction after
    point k - 1 starts waits for point k's reach, so the gap counts from that first start. Asked
    there, at every point of a segment, the golden model's pause takes no longer than the largest
    gap; asked before it, the pause stops at point k - 1."""
    import onnx

    z = zoo.perception()
    onnx.save(z.model, str(tmp_path / "perc.onnx"))
    cm = compile_onnx(tmp_path / "perc.onnx", calib=z.calib, order="default", cp_interval=10_000)
    pts = [p for p in cm.lowered.points if p.segment == 0]
    assert all(p.est_first_start is not None for p in pts[:-1])  # the last: nothing after it
    assert any(p.est_first_start < p.est_cycles for p in pts)  # some unit runs ahead
    assert cm.max_cp_gap == max(_gaps(cm.lowered.points))
    seg = cm.lowered.segments[0]
    prog = cm.lowered.program[seg.pc : seg.end + 1]
    waits = []
    for k in range(len(pts)):  # asked as the first thing after point k starts (k = 0: at the start)
        m = NpuModel(cm.cfg, timing_only=True)
        m.load_instructions(prog, 0)
        m.start(pc=0)
        if k:
            m.advance_until_passed(k)  # the first unit has just passed point k: it can stop there
            m.request_pause()
            assert m.run() == Status.PAUSED and m.cp_id == pts[k - 1].id, (k, m.status)
            m = NpuModel(cm.cfg, timing_only=True)
            m.load_instructions(prog, 0)
            m.start(pc=0)
            m.advance_until_target(k + 1)
        t = m.now
        m.request_pause()
        assert m.run() == Status.PAUSED and m.cp_id == pts[k].id, (k, m.status)
        waits.append(m.now - t)
    assert max(waits) <= cm.max_cp_gap + 16, (max(waits), cm.max_cp_gap)
    assert max(waits) >= 0.8 * cm.max_cp_gap  # the bound is near the worst case, not loose


def test_a_program_too_large_with_the_pause_budget_falls_back_to_operator_boundaries(tmp_path):
    """On `tiny` (64 KiB of DRAM, 24 MHz) the default budget's cut operators make a program that does
    not fit: the compiler keeps points at operator boundaries and the report says why; an interval
    asked for in cycles is never dropped (the error says what does not fit)."""
    from npu.compiler import CompileError
    from tests.compiler.test_int16 import _two_convs

    path, calib = _two_convs(tmp_path, 32)
    cm = compile_onnx(path, "tiny", calib=calib, activations="int8")
    assert all(p.kind == "spill" for p in cm.lowered.points)
    assert "only at operator boundaries: with points at most 500 us apart (--max-pause-us) the model did " \
           "not fit" in cm.report()  # fmt: skip
    assert cm.max_cp_gap > 500 * cm.cfg.clock_mhz
    with pytest.raises(CompileError, match="bytes of DRAM on tiny"):
        compile_onnx(path, "tiny", calib=calib, activations="int8", cp_interval=12_000)


def test_the_default_live_budget_is_a_preference_an_explicit_one_a_limit():
    """choose(): candidates every 4,000 cycles, interval 10,000, the ones at 4k and 16k within the
    live budget, the rest above it. The default budget takes the small ones where they close the
    gap and a large one only where none does; an explicit --cp-max-live never takes a large one."""
    from npu.compiler.points import Candidate, PointPolicy, choose
    from npu.config import PRESETS

    cfg = PRESETS["default"]
    big = [(0, cfg.spad_bytes // 4 + 1)]
    small = [(0, 64)]
    cands = [Candidate(k, 4000 * k, False, small if k in (1, 4) else big) for k in range(1, 10)]
    cands.append(Candidate(10, 40_000, True, []))
    soft = choose(cands, PointPolicy(interval=10_000), cfg)
    times = [c.t for c in soft]
    assert times[:2] == [4000, 12000]  # 4k (small), then 12k: no small one before 16k closes the gap
    assert all(b - a <= 10_000 for a, b in zip([0, *times], times, strict=False))
    hard = choose(cands, PointPolicy(interval=10_000, max_live=cfg.spad_bytes // 4), cfg)
    assert [c.t for c in hard] == [4000, 16000, 40_000]


def test_operators_between_two_points_overlap(tmp_path):
    """With a pause budget, an operator boundary is a point only where the interval needs one; the
    operators between two points go in the order their instructions can start (the next one's
    loads under this one's compute: their pc ranges interleave, where nothing crosses a point at
    every boundary): no more cycles than with a point at every boundary (since the units run on
    past a point's marker and no false dependency holds the next operator back, the two are often
    the same), the same values, and every gap still within the interval."""
    z = zoo.digits_cnn()
    import onnx

    onnx.save(z.model, str(tmp_path / "d.onnx"))
    kw = dict(calib=z.calib, order="default", activations="int8")
    every = compile_onnx(tmp_path / "d.onnx", "default", max_pause_us=0, **kw)
    # (the gaps count from the first unit past a point, about 900 cycles with a point at every
    # boundary of this 1,300-cycle program: an interval of 1,200 needs some boundaries, not all)
    budget = compile_onnx(tmp_path / "d.onnx", "default", cp_interval=1_200, **kw)
    npu_ops = sum(la.placement == "npu" for la in budget.lowered.layers)
    assert len(every.lowered.points) >= npu_ops > len([p for p in budget.lowered.points if p.kind == "spill"])
    x = z.test[:1]
    cycles = [run_container(cm.to_container(), [x], cm.cfg)[1]["CYCLES"] for cm in (every, budget)]
    assert cycles[1] <= cycles[0], cycles

    def interleaved(cm) -> int:
        npu = [la.pc for la in cm.lowered.layers if la.placement == "npu" and la.pc]
        return sum(b[0] < a[1] for a, b in zip(npu, npu[1:], strict=False))

    assert interleaved(budget) > 0 == interleaved(every)
    assert all(np.array_equal(a, b) for a, b in zip(budget.run_int8(x), every.run_int8(x), strict=True))
    assert budget.max_cp_gap <= 1_200 < cycles[1], (budget.max_cp_gap, cycles)
    # the layers' cycles add up to the golden model's count (each pc's advance goes to one layer)
    layer_cycles = sum(la.est_cycles or 0 for la in budget.lowered.layers if la.placement == "npu")
    assert layer_cycles == cycles[1]


def test_the_report_gives_the_cycles_the_points_add(tmp_path, monkeypatch):
    """The points' cost is the golden model's cycles of the program with them less the same
    lowering and order assembled without any: exactly, and the report says so."""
    import onnx

    from npu.compiler import compile as compile_mod
    from npu.container import NpuSegment

    z = zoo.digits_cnn()
    onnx.save(z.model, str(tmp_path / "d.onnx"))
    calls, assemble = [], compile_mod.assemble
    monkeypatch.setattr(compile_mod, "assemble", lambda *a, **k: calls.append((a, k)) or assemble(*a, **k))
    cm = compile_onnx(tmp_path / "d.onnx", "default", calib=z.calib, cp_interval=1_000, activations="int8")
    (low, order, policy, *rest), kw = calls[-1]
    assert policy is not None and policy.interval == 1_000 and len(cm.lowered.points) > 1
    without = assemble(low, order, None, *rest, **kw)

    def cycles(lowered):
        return sum(s.est_cycles or 0 for s in lowered.segments if isinstance(s, NpuSegment))

    assert not without.points and cm.cp_cycles_added == cycles(cm.lowered) - cycles(without) > 0
    assert f"they add {cm.cp_cycles_added:,} cycles" in cm.report()
    # points at operator boundaries only (no interval) are placed on estimates: not measured
    kw = dict(calib=z.calib, max_pause_us=0, activations="int8")
    boundaries = compile_onnx(tmp_path / "d.onnx", "default", **kw)
    assert boundaries.lowered.points and boundaries.cp_cycles_added is None
    assert "they add" not in boundaries.report()


def test_live_ranges_are_the_bytes_written_before_and_read_after_each_candidate():
    """`fragment_liveness` keeps sets of ranges; a byte map is the oracle: a byte is live at a
    candidate if written before it and read after it before any write overwrites it."""
    from npu.compiler.points import fragment_liveness
    from npu.config import ACC_BASE, get_config
    from npu.isa import footprint, make
    from npu.program import Item

    cfg = get_config("tiny")
    size = cfg.spad_bytes + cfg.acc_bytes
    rng = np.random.default_rng(7)

    def index(a):
        return a - ACC_BASE + cfg.spad_bytes if a >= ACC_BASE else a

    def instr():
        base, mem = (0, cfg.spad_bytes) if rng.random() < 0.6 else (ACC_BASE, cfg.acc_bytes)
        cols, rows = int(rng.integers(1, 48)), int(rng.integers(1, 4))
        stride = int(rng.integers(cols, 96))
        at = base + int(rng.integers(0, mem - (rows - 1) * stride - cols + 1))
        # at the memories' ends too, where a range of the joint index space would cross them
        at = base + mem - (rows - 1) * stride - cols if rng.random() < 0.2 else at
        op = "load" if rng.random() < 0.5 else "store"
        return make(op, spad=at, dram=0, rows=rows, cols=cols, spad_stride=stride, dram_stride=stride)

    for _ in range(300):
        items = [Item("cand") if rng.random() < 0.3 else Item("instr", instr()) for _ in range(30)]
        got = fragment_liveness(items, cfg)
        for c in (i for i, it in enumerate(items) if it.kind == "cand"):
            written, live, dead = np.zeros(size, bool), np.zeros(size, bool), np.zeros(size, bool)
            for i, it in enumerate(items):
                if it.kind != "instr":
                    continue
                r, w = ([s for s in f if s.space == "onchip"] for f in footprint(it.instr))
                for s in r if i > c else []:
                    for b in range(index(s.start), index(s.end - 1) + 1):
                        live[b] |= not dead[b]
                for s in w:
                    span = slice(index(s.start), index(s.end - 1) + 1)
                    if i < c:
                        written[span] = True
                    else:
                        dead[span] = True
            want = np.zeros(size, bool)
            for s, e in got[c]:
                assert s < e and (e <= cfg.spad_bytes or s >= ACC_BASE), (s, e)
                want[index(s) : index(e - 1) + 1] = True
            assert (want == (written & live)).all(), (c, got[c])
