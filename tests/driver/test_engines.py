"""The driver over several engines on the SoC's golden model: operators as units of work,
dependencies across engines, every dispatch policy bit-exact against one engine, per-engine
preemption, reference runtimes and the per-engine trace."""

import json

import numpy as np
import onnx
import pytest

from npu.compiler import compile_onnx
from npu.container import Container, NpuSegment
from npu.driver import DriverError, Npu, Priority
from npu.driver.profile import measure, with_reference_runtimes
from npu.driver.transport import ModelTransport
from npu.models import zoo

POLICIES = ["shared", "expected-time", "count", "round-robin"]


@pytest.fixture(scope="module")
def op_models(tmp_path_factory):
    """A branchy network and the planning MLP, one segment per operator, for `default`."""
    d = tmp_path_factory.mktemp("ops")
    out = {}
    for z in (zoo.inception_small(), zoo.planning()):
        onnx.save(z.model, str(d / f"{z.name}.onnx"))
        cm = compile_onnx(d / f"{z.name}.onnx", "default", calib=z.calib, granularity="operator")
        out[z.name] = (cm.to_container(), z.test[:1])
    return out


def _alone(c: Container, x) -> list[np.ndarray]:
    npu = Npu("model", "default")
    return npu.load(c).run(x, int8=True)


def _run_spans(npu: Npu) -> dict[tuple[int, int], list]:
    """(job, segment) -> its run spans (engine, start, end)."""
    spans: dict[tuple[int, int], list] = {}
    for e in npu.trace.spans("run"):
        seg = int(e.info.split()[-1])
        spans.setdefault((e.job, seg), []).append((e.engine, e.start, e.end))
    return spans


@pytest.mark.parametrize(
    "policy,enqueue", [(p, "ready") for p in POLICIES] + [("expected-time", "submit"), ("count", "submit")]
)
def test_jobs_over_two_engines_are_bit_exact_and_respect_dependencies(op_models, policy, enqueue):
    refs = {k: _alone(c, x) for k, (c, x) in op_models.items()}
    npu = Npu("model", "duo", dispatch=policy, enqueue=enqueue)
    models = {k: npu.load(c, k, instances=2) for k, (c, _) in op_models.items()}
    jobs = []
    for i in range(3):
        for k, (_, x) in op_models.items():
            jobs.append((k, models[k].submit(x, int8=True, at=i * 5000)))
    npu.run_all()
    for k, j in jobs:
        assert j.state == "done"
        assert all(np.array_equal(a, b) for a, b in zip(j.outputs, refs[k], strict=True)), (k, j.id)
    assert all(u > 0 for u in npu.utilization())
    assert any(len(j.engines_used) == 2 for _, j in jobs)  # one job's operators on both engines
    spans = _run_spans(npu)
    for k, j in jobs:
        deps = models[k].deps
        for s, seg in enumerate(j.manifest.segments):
            if not isinstance(seg, NpuSegment):
                continue
            start = min(t0 for _, t0, _ in spans[(j.id, s)])
            for d in deps[s]:
                if (j.id, d) in spans:  # an NPU producer: it ended before this operator began
                    assert max(t1 for _, _, t1 in spans[(j.id, d)]) <= start, (k, s, d)


def test_enqueue_at_submit_queues_every_operator_when_the_job_starts(op_models):
    """The design's setting: all of a job's NPU segments are in the queues once it starts; heads that
    wait for their inputs hold their engine, so nothing runs out of dependency order."""
    c, x = op_models["inception_small"]
    n_npu = sum(isinstance(s, NpuSegment) for s in c.manifest.segments)
    for enqueue in ("ready", "submit"):
        npu = Npu("model", "duo", dispatch="count", enqueue=enqueue)
        job = npu.load(c).submit(x, int8=True)
        npu.run_until(lambda: job.admitted is not None)  # noqa: B023 - run_until calls it at once
        placed = len(npu.dispatch) + sum(e.unit is not None for e in npu.engines)
        if enqueue == "submit":
            assert placed == n_npu
        else:
            assert placed < n_npu  # only the operators whose inputs exist
        npu.run_all()
        assert job.state == "done"


def test_an_urgent_job_preempts_one_engine_and_everyone_stays_bit_exact(demo_models, op_models):
    m = demo_models
    ref_low = _alone(m.perception, m.x_perception)
    c_plan, x_plan = op_models["planning"]
    ref_hi = _alone(c_plan, x_plan)
    npu = Npu("model", "duo", dispatch="expected-time")
    low = npu.load(m.perception, "perception", instances=2)
    hi = npu.load(c_plan, "planning")
    t = npu.tr.now()
    lows = [low.submit(m.x_perception, priority=Priority.LOW, int8=True) for _ in range(2)]
    urgent = hi.submit(x_plan, priority=Priority.HIGH, int8=True, at=t + 150_000)
    npu.run_all()
    assert all(np.array_equal(a, b) for j in lows for a, b in zip(j.outputs, ref_low, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(urgent.outputs, ref_hi, strict=True))
    pre = [p for j in lows for p in j.preemptions]
    assert pre and all(p.by == urgent.id for p in pre)
    assert urgent.finished < min(j.finished for j in lows)
    assert urgent.latency < 100_000  # it did not wait for a perception job to end


def test_profile_records_each_segments_cycles_measured_alone(op_models):
    c, x = op_models["inception_small"]
    cycles = measure(ModelTransport(Npu("model", "default").cfg), c, [x])
    npu_segs = [i for i, s in enumerate(c.manifest.segments) if isinstance(s, NpuSegment)]
    assert sorted(cycles) == npu_segs and all(v > 0 for v in cycles.values())
    p = with_reference_runtimes(c, cycles)
    again = Container.from_bytes(p.to_bytes())
    assert [again.manifest.segments[i].ref_cycles for i in npu_segs] == [cycles[i] for i in npu_segs]
    npu_layers = [la for la in again.manifest.layers if la.placement == "npu"]
    assert sorted(la.ref_cycles for la in npu_layers) == sorted(cycles.values())  # one operator each
    # a quiet run's measurement does not depend on the input
    assert measure(ModelTransport(Npu("model", "default").cfg), c) == cycles


def test_trace_has_one_track_per_engine(op_models, tmp_path):
    c, x = op_models["inception_small"]
    npu = Npu("model", "default", engines=2)
    lm = npu.load(c, instances=2)
    for _ in range(2):
        lm.submit(x)
    npu.run_all()
    npu.trace.save_chrome(tmp_path / "t.json")
    ev = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert {e["tid"] for e in ev if e["cat"] == "run"} == {"engine 0", "engine 1"}


def test_bad_arguments_are_named(op_models):
    with pytest.raises(DriverError, match="unknown operator-queue policy 'fastest'"):
        Npu("model", "duo", dispatch="fastest")
    with pytest.raises(DriverError, match="enqueue must be one of ready, submit"):
        Npu("model", "duo", dispatch="count", enqueue="later")
    with pytest.raises(DriverError, match="needs per-engine operator queues"):
        Npu("model", "duo", enqueue="submit")
    with pytest.raises(DriverError, match="engines must be a positive integer"):
        Npu("model", "default", engines=0)
    npu = Npu("model", "duo")
    with pytest.raises(DriverError, match="instances must be a positive integer"):
        npu.load(op_models["planning"][0], instances=0)
