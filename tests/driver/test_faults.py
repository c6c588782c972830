"""The driver under faults and misuse: jobs never share activations, an exception anywhere leaves one
job FAILED and the device usable, long timeouts, threads, unloading, input policy."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu.compiler import compile_onnx
from npu.config import get_config
from npu.container import HostStep
from npu.driver import DriverError, JobError, ModelTransport, Npu, Priority, Transport, TransportError
from npu.driver import runtime as runtime_mod
from npu.models.builder import Net
from npu.registers import REG, Control, Status

DRIVER_FILES = ("runtime.py", "executor.py", "trace.py")


@pytest.fixture(scope="module")
def host_model(tmp_path_factory):
    """An MLP with a Softmax between its layers: NPU segment, host step, NPU segment."""
    d = tmp_path_factory.mktemp("host")
    net = Net("mlp_sm", (1, 32), seed=5)
    y = net.gemm(net.softmax(net.gemm(net.input, 16)), 8)
    onnx.save(net.model([y]), str(d / "m.onnx"))
    calib = np.random.default_rng(1).normal(size=(16, 32)).astype(np.float32)
    c = compile_onnx(d / "m.onnx", "tiny", calib=calib).to_container()
    assert any(isinstance(s, HostStep) for s in c.manifest.segments)
    return c


def _alone(container, x) -> list[np.ndarray]:
    return Npu("model", "tiny").load(container).run(x, int8=True)


def test_job_started_at_cycle_zero_is_counted_as_started(demo_models):
    """Defect: a job started at cycle 0 was not counted as started, so a second job of its model ran
    in its activation area while it was preempted, and the first returned the second's output."""
    m = demo_models
    npu = Npu("model", "default")
    per, plan = npu.load(m.perception, "perception"), npu.load(m.planning, "planning")
    x2 = np.random.default_rng(9).normal(size=m.x_perception.shape).astype(np.float32)
    first = per.submit(m.x_perception, priority=Priority.LOW, at=0, int8=True)
    plan.submit(m.x_planning, priority=Priority.HIGH, at=300_000)
    second = per.submit(x2, priority=Priority.URGENT, at=300_001, int8=True)
    assert first.arrival == 0
    npu.run_all()
    assert first.preemptions, "the scenario needs the first job to be preempted"
    assert second.started >= first.finished  # the same model's activations: one job at a time
    ref = Npu("model", "default").load(m.perception)
    assert np.array_equal(first.outputs[0], ref.run(m.x_perception, int8=True)[0])
    assert np.array_equal(second.outputs[0], ref.run(x2, int8=True)[0])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["small", "mlp"]),
            st.one_of(st.just(0), st.integers(0, 4000)),
            st.sampled_from(list(Priority)),
            st.integers(0, 2),
        ),
        min_size=2,
        max_size=6,
    )
)
def test_random_arrivals_and_priorities_are_bit_exact(small_models, variants, jobs):
    c_small, c_mlp, _, _ = small_models
    npu = Npu("model", "tiny")
    models = {"small": npu.load(c_small), "mlp": npu.load(c_mlp)}
    subs = [
        (name, k, models[name].submit(variants[name, k][0], priority=p, at=at, int8=True))
        for name, at, p, k in jobs
    ]
    npu.run_all()
    for name, k, job in subs:
        assert job.state == "done"
        assert np.array_equal(job.outputs[0], variants[name, k][1][0]), (name, k, job.arrival, job.priority)


@pytest.fixture(scope="module")
def variants(small_models):
    """Three inputs per model, keyed (model, k), each with its outputs from a run alone."""
    c_small, c_mlp, x_small, x_mlp = small_models
    out = {}
    for k in range(3):
        out["small", k] = (x_small + k, _alone(c_small, x_small + k))
        out["mlp", k] = (x_mlp * (k + 1), _alone(c_mlp, x_mlp * (k + 1)))
    return out


class FaultyTransport(Transport):
    """The golden model behind a wrapper that records where each call came from and can raise at the
    n-th call once armed."""

    def __init__(self, cfg):
        self.inner = ModelTransport(cfg)
        self.cfg = cfg
        self.calls = 0
        self.sites: list[str] = []
        self.fail_at: int | None = None
        self.armed = False

    def _call(self, name: str, *args):
        if self.armed:
            if self.calls == self.fail_at:
                self.calls += 1
                raise TransportError(f"injected fault in {name}")
            self.sites.append(_site())
            self.calls += 1
        return getattr(self.inner, name)(*args)

    def read_reg(self, offset):
        return self._call("read_reg", offset)

    def write_reg(self, offset, value):
        return self._call("write_reg", offset, value)

    def read_dram(self, addr, n):
        return self._call("read_dram", addr, n)

    def write_dram(self, addr, data):
        return self._call("write_dram", addr, data)

    def wait(self, max_cycles):
        return self._call("wait", max_cycles)

    def now(self):
        return self._call("now")


def _site() -> str:
    """The driver line that made the current transport (or host) call."""
    f = sys._getframe(2)
    while f is not None:
        name = Path(f.f_code.co_filename).name
        if name in DRIVER_FILES and f.f_code.co_name not in ("reg", "set_reg", "status", "counter"):
            return f"{name}:{f.f_lineno}"
        f = f.f_back
    return "?"


X_HOST = np.random.default_rng(4).normal(size=(1, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def scenario_refs(small_models, host_model):
    """The outputs of `_scenario`'s four jobs, each run alone."""
    c_small, c_mlp, x_small, x_mlp = small_models
    pairs = [(c_small, x_small), (host_model, X_HOST), (c_mlp, x_mlp), (c_small, x_small + 1)]
    return [_alone(c, x) for c, x in pairs]


def _scenario(small_models, host_model, fault: Callable[[FaultyTransport, Npu], None] | None):
    """Four jobs that exercise start, host steps, preemption (dump, restore) and waiting; returns the
    transport, the device, the jobs, and the models with their inputs."""
    c_small, c_mlp, x_small, x_mlp = small_models
    tr = FaultyTransport(get_config("tiny"))
    npu = Npu(transport=tr, config="tiny")
    small, mlp, host = npu.load(c_small, "small"), npu.load(c_mlp, "mlp"), npu.load(host_model, "host")
    plan = [
        (small, x_small, Priority.LOW, 0),
        (host, X_HOST, Priority.NORMAL, 200),
        (mlp, x_mlp, Priority.HIGH, 400),
        (small, x_small + 1, Priority.LOW, 500),
    ]
    jobs = [m.submit(x, priority=p, at=at, int8=True) for m, x, p, at in plan]
    tr.armed = True
    if fault is not None:
        fault(tr, npu)
    escaped = 0
    while True:
        try:
            npu.run_all(timeout_s=60)
            break
        except (TransportError, RuntimeError) as e:
            if isinstance(e, DriverError):
                raise
            escaped += 1  # a call no job made (the scheduler's own clock reads): the caller sees it
            assert escaped < 5
    return tr, npu, jobs, (small, mlp, host), (x_small, x_mlp, X_HOST)


def test_a_fault_at_any_call_site_fails_one_job_and_the_rest_finish_bit_exact(
    small_models, host_model, scenario_refs
):
    rf = scenario_refs
    tr, npu, jobs, _, _ = _scenario(small_models, host_model, None)
    assert all(j.state == "done" for j in jobs)
    assert any(j.preemptions for j in jobs)
    first_call: dict[str, int] = {}
    for n, site in enumerate(tr.sites):
        first_call.setdefault(site, n)
    injected = failed_total = 0
    cases = [("transport", site, n) for site, n in first_call.items()] + [("host step", "host.run", 0)]
    for kind, site, n in cases:

        def fault(t, dev, n=n, kind=kind):
            if kind == "transport":
                t.fail_at = n
            else:
                lm = next(m for m in dev.models if m.name == "host")

                def broken(*a, **k):
                    raise RuntimeError("injected fault in a host step")

                lm.host.run = broken

        _, dev, js, models, xs = _scenario(small_models, host_model, fault)
        injected += 1
        failed = [j for j in js if j.state == "failed"]
        assert all(j.done() for j in js), site
        assert len(failed) <= 1, (site, [str(j.error) for j in failed])
        for j in failed:
            assert "injected fault" in str(j.error), site
        failed_total += len(failed)
        for j, r in zip(js, rf, strict=True):
            if j.state == "done":
                assert np.array_equal(j.outputs[0], r[0]), site
        # the device goes on: every model runs again, bit-exact
        if kind == "host step":
            continue
        for m, x, r in zip(models, xs, [rf[0], rf[2], rf[1]], strict=True):
            assert np.array_equal(m.run(x, int8=True)[0], r[0]), site
    print(f"\nfault injection: {injected} call sites, {failed_total} jobs failed with the fault attached")
    assert injected > 20 and failed_total > 10


def test_bad_arguments_are_refused_and_leave_the_device_usable(small_models):
    c_small, c_mlp, x_small, x_mlp = small_models
    npu = Npu("model", "tiny")
    mlp = npu.load(c_mlp)
    ref = mlp.run(x_mlp)
    for kw, msg in [
        ({"timeout_cycles": 2.5}, "timeout_cycles must be an integer"),
        ({"timeout_cycles": 0}, "timeout_cycles must be >= 1"),
        ({"timeout_cycles": True}, "integer"),
        ({"at": -5}, "at must be >= 0"),
        ({"at": "soon"}, "at must be an integer"),
        ({"priority": "high"}, "priority must be"),
    ]:
        with pytest.raises(DriverError, match=msg):
            mlp.submit(x_mlp, **kw)
    with pytest.raises(DriverError, match="NaN or infinite"):
        mlp.submit(np.full_like(x_mlp, np.nan))
    with pytest.raises(DriverError, match="real numbers"):
        mlp.submit(x_mlp.astype(np.complex64))
    assert mlp.run(np.where(np.isnan(x_mlp), 0, x_mlp), allow_nonfinite=True)[0].shape == ref[0].shape
    inf = x_mlp.copy()
    inf[0, 0] = np.inf
    assert mlp.submit(inf, allow_nonfinite=True).result()[0].shape == ref[0].shape
    assert np.array_equal(mlp.run(x_mlp)[0], ref[0])


def test_timeouts_beyond_the_register_range_are_kept_by_the_driver(small_models, monkeypatch):
    c_small, c_mlp, x_small, x_mlp = small_models
    npu = Npu("model", "tiny")
    small = npu.load(c_small)
    ref = small.run(x_small)
    need = npu.jobs[-1].counters["CYCLES"]
    # 2^32 + 100 used to wrap to 100 cycles, 2^32 to "no limit"
    for t in (2**32 + 100, 2**32, 2**40):
        assert np.array_equal(small.run(x_small, timeout_cycles=t)[0], ref[0])
    monkeypatch.setattr(runtime_mod, "TIMEOUT_MAX", 1000)  # a register of 10 bits: the driver keeps the rest
    with pytest.raises(JobError, match=f"exceeded its timeout of {need // 2} cycles"):
        small.run(x_small, timeout_cycles=need // 2)
    assert np.array_equal(small.run(x_small, timeout_cycles=need * 2)[0], ref[0])


def test_callbacks_that_raise_fail_their_own_job_only(small_models):
    c_small, c_mlp, x_small, x_mlp = small_models
    npu = Npu("model", "tiny")
    mlp, small = npu.load(c_mlp), npu.load(c_small)
    ref = small.run(x_small)

    def boom(job):
        raise ValueError("callback failed")

    bad = mlp.submit(x_mlp, on_done=boom)
    good = small.submit(x_small)
    assert np.array_equal(good.result()[0], ref[0])
    with pytest.raises(ValueError, match="callback failed"):
        bad.result()
    assert bad.state == "failed"


def test_threads_share_one_device(small_models):
    c_small, c_mlp, x_small, x_mlp = small_models
    npu = Npu("model", "tiny")
    models = [npu.load(c_small), npu.load(c_mlp)]
    xs = [[x_small + k for k in range(4)], [x_mlp * (k + 1) for k in range(4)]]
    refs = [[_alone(c, x) for x in xx] for c, xx in zip([c_small, c_mlp], xs, strict=True)]
    wrong, errors = [], []

    def worker(t: int) -> None:
        rng = np.random.default_rng(t)
        try:
            for i in range(50):
                which, k = int(rng.integers(2)), int(rng.integers(4))
                p = Priority(int(rng.integers(4)))
                out = models[which].run(xs[which][k], priority=p, int8=True)
                if not np.array_equal(out[0], refs[which][k][0]):
                    wrong.append((t, i))
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors and not wrong
    assert sum(j.state == "done" for j in npu.jobs) == 200


def test_load_and_unload_return_dram(small_models, tmp_path):
    c_small, c_mlp, x_small, x_mlp = small_models
    with Npu("model", "tiny") as npu:
        ref = npu.load(c_mlp).run(x_mlp)
        free0 = npu.memory.free_bytes
        for _ in range(10_000):
            npu.load(c_small).unload()
        assert npu.memory.free_bytes == free0
        with npu.load(c_mlp) as m:
            assert np.array_equal(m.run(x_mlp)[0], ref[0])
            j = m.submit(x_mlp)
            with pytest.raises(DriverError, match="unfinished jobs"):
                m.unload()
            j.result()
        assert not m.loaded
        with pytest.raises(DriverError, match="unloaded"):
            m.submit(x_mlp)
        with pytest.raises(DriverError, match="is a directory"):
            npu.load(tmp_path)
        # freed ranges are reused and merged: fill DRAM, free every other model, load a big one
        ms = []
        with pytest.raises(DriverError, match="unload a model first"):
            while True:
                ms.append(npu.load(c_mlp))
        for m in ms:
            m.unload()
        assert len(npu.memory.ranges) == 1


class HungTransport(ModelTransport):
    """The golden model, except that once a run starts its engine never stops: STATUS stays RUNNING
    and no interrupt comes, so a wait without a cycle bound would never return (it fails the test)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.hung = False
        self.waits: list[int] = []

    def write_reg(self, offset, value):
        if offset == REG["CONTROL"].offset and value & Control.START:
            self.hung = True
        super().write_reg(offset, value)

    def read_reg(self, offset):
        if self.hung and offset == REG["STATUS"].offset:
            return int(Status.RUNNING)
        return super().read_reg(offset)

    def wait(self, max_cycles):
        if self.hung:
            assert max_cycles is not None, "the driver waited without a bound on an engine that never stops"
            self.waits.append(max_cycles)
            time.sleep(0.05)  # a real device takes wall time to run the cycles
        return super().wait(max_cycles)


def test_a_hung_engine_ends_in_a_timeout_not_a_wait_for_ever(small_models):
    c_small, _, x_small, _ = small_models
    tr = HungTransport(get_config("tiny"))
    npu = Npu(transport=tr, config="tiny")
    npu.load(c_small).submit(x_small)
    with pytest.raises(TimeoutError, match="not finished after 1.5 s of wall time"):
        npu.run_all(timeout_s=1.5)
    # every wait was bounded (a wait for ever would hang: pytest-timeout ends it)
    assert tr.waits and max(tr.waits) <= runtime_mod.TIMED_WAIT_CYCLES
