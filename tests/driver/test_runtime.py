"""The driver on the golden model: jobs, priorities, preemption at every point, errors and recovery."""

import json

import numpy as np
import pytest

from npu.container import Container
from npu.driver import DriverError, JobError, Npu, Priority
from npu.driver.bench import preempt_at_every_point
from npu.isa import encode_program, make


@pytest.mark.parametrize("which", ["small", "demo"])
def test_preemption_at_every_point_is_bit_exact(which, small_models, demo_models):
    if which == "small":
        c_low, c_hi, x, xu = small_models
        cfg = "tiny"
    else:
        c_low, c_hi, x, xu = (
            demo_models.perception,
            demo_models.planning,
            demo_models.x_perception,
            demo_models.x_planning,
        )
        cfg = "default"
    npu = Npu("model", cfg)
    low, hi = npu.load(c_low, "low"), npu.load(c_hi, "urgent")
    ref = low.run(x, int8=True)
    got, records = preempt_at_every_point(npu, low, x, hi, xu)
    stops = [r.cp for r in records]
    points = c_low.manifest.cancel_points
    assert stops == [p.id for p in points]
    assert any(p.live_bytes > 0 for p in points)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))
    job = npu.jobs[1]
    assert sum(p.dump_cycles > 0 for p in job.preemptions) == sum(p.live_bytes > 0 for p in points)


def test_priorities_nested_preemption_and_trace(demo_models, tmp_path):
    m = demo_models
    c_low, c_hi, x, xu = m.perception, m.planning, m.x_perception, m.x_planning
    npu = Npu("model", "default")
    low, mid, hi = npu.load(c_low, "low"), npu.load(c_low, "mid"), npu.load(c_hi, "high")
    ref_low, ref_hi = low.run(x), hi.run(xu)
    t = npu.tr.now()
    j_low = low.submit(x, priority=Priority.LOW)
    j_mid = mid.submit(x, priority=Priority.NORMAL, at=t + 100_000)
    j_hi = hi.submit(xu, priority=Priority.HIGH, at=t + 200_000)
    npu.run_all()
    assert all(j.state == "done" for j in (j_low, j_mid, j_hi))
    assert j_low.preemptions and j_low.preemptions[0].by == j_mid.id
    assert j_mid.preemptions and j_mid.preemptions[0].by == j_hi.id  # nested
    assert j_hi.finished < j_mid.finished < j_low.finished
    # counters add up over a preempted job's runs: the same work as one uninterrupted run
    alone = low.submit(x)
    alone.result()
    for k in ("DMA_RD_BYTES", "DMA_WR_BYTES", "BUSY_MATRIX"):
        assert j_low.counters[k] == alone.counters[k], k
    assert np.array_equal(j_low.outputs[0], ref_low[0]) and np.array_equal(j_mid.outputs[0], ref_low[0])
    assert np.array_equal(j_hi.outputs[0], ref_hi[0])
    npu.trace.save_chrome(tmp_path / "t.json")
    npu.trace.save_png(tmp_path / "t.png")
    ev = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    kinds = {e["cat"] for e in ev}
    assert {"run", "pause request", "paused", "submit", "done", "resume"} <= kinds
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_job_reaching_end_before_any_point_is_waited_for(small_models, mlp_without_points):
    c_low, c_hi, x, xu = small_models
    npu = Npu("model", "tiny")
    plain, urgent = npu.load(mlp_without_points, "no points"), npu.load(c_low, "urgent")
    assert not mlp_without_points.manifest.cancel_points
    t = npu.tr.now()
    j = plain.submit(xu, priority=Priority.LOW)
    u = urgent.submit(x, priority=Priority.HIGH, at=t + 50)
    npu.run_all()
    assert j.state == u.state == "done" and not j.preemptions
    assert any(e.kind == "pause request" and e.job == j.id for e in npu.trace.events)
    assert j.finished <= u.started  # the pause request found no point: the job ran to END first


def test_misuse_gives_clear_errors_and_the_device_recovers(small_models, tmp_path):
    c_low, c_hi, x, xu = small_models
    npu = Npu("model", "tiny")
    low, hi = npu.load(c_low, "low"), npu.load(c_hi, "high")
    ref = hi.run(xu)
    # resuming a job that was never paused
    j = hi.submit(xu)
    with pytest.raises(DriverError, match="never paused"):
        npu.resume(j)
    j.result()
    # a device left in error by a bad program: the next submit recovers it
    bad = encode_program([make("load", spad=0, dram=npu.cfg.dram_bytes - 4, rows=1, cols=64), make("end")])
    from npu.registers import Status

    assert npu.run_raw(bad) == Status.ERROR
    assert np.array_equal(hi.run(xu)[0], ref[0])
    # a job that exceeds its timeout fails clearly, the next one runs
    with pytest.raises(JobError, match="exceeded its timeout of 100 cycles"):
        low.submit(x, timeout_cycles=100).result()
    assert np.array_equal(hi.run(xu)[0], ref[0])
    # corrupt and mismatched programs
    blob = c_hi.to_bytes()
    (tmp_path / "bad.npub").write_bytes(blob[:-3] + b"xyz")
    from npu.container import ContainerError

    with pytest.raises(ContainerError, match="checksum"):
        npu.load(tmp_path / "bad.npub")
    other = Npu("model", "default")
    with pytest.raises(DriverError, match="compiled for configuration"):
        other.load(Container.from_bytes(blob))
    # wrong inputs
    with pytest.raises(DriverError, match="shape"):
        hi.submit(np.zeros((2, 32), np.float32))
    with pytest.raises(DriverError, match="unknown backend"):
        Npu("fpga")


def test_models_share_dram_without_overlap(small_models):
    c_low, c_hi, x, xu = small_models
    npu = Npu("model", "tiny")
    a, b = npu.load(c_hi, "a"), npu.load(c_hi, "b")
    assert a.region[1] <= b.region[0]
    assert np.array_equal(a.run(xu)[0], b.run(xu)[0])
    with pytest.raises(DriverError, match="bytes of DRAM"):
        for _ in range(20):
            npu.load(c_low)
