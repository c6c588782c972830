"""The runtime API: `Npu(backend=...)`, `load(program) -> LoadedModel`, `model.run(inputs)`,
`submit(...) -> Job`, priorities and preemption at cancellation points.

Scheduling is event driven in device time (cycles): jobs arrive (now, or at a given cycle), the
highest priority ready job runs, and a job that becomes ready with a higher priority than the running
one preempts it:

1. the driver sets PAUSE; the core stops at its next cancellation point (a job that reaches END
   first is simply waited for);
2. the driver reads CP_ID and RESUME_PC and dumps that point's live on-chip ranges into the job's save
   area with a driver-generated program of STOREs run by the NPU itself;
3. the urgent job runs; later the preempted job's ranges are restored by a program of LOADs and it
   resumes at the saved PC. Preemption nests (every job has its own save area).

Between two program segments of a job (host steps) nothing is on chip, so a job yields there for free.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import numbers
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npu.arith import round_up
from npu.config import NpuConfig, get_config
from npu.container import CancelPoint, Container, HostStep, Manifest, relocate
from npu.executor import HostSteps, check_inputs, read_outputs, write_inputs
from npu.isa import ErrorCode, encode_program
from npu.program import ProgramBuilder, copy_range
from npu.registers import COUNTERS, NPU_MAGIC, Control, Status

from .trace import Trace
from .transport import ModelTransport, Transport

AUX_BYTES = 0x10000  # DRAM reserved at address 0 for the driver's dump and restore programs (at most)
RUN = Control.START | Control.IRQ_ENABLE
TIMEOUT_MAX = 0xFFFF_FFFF  # the TIMEOUT register's range; longer budgets are kept by the driver
PAGE = 4096  # models are placed on DRAM pages


class Priority(enum.IntEnum):
    LOW = 0
    NORMAL = 1
    HIGH = 2
    URGENT = 3


class DriverError(RuntimeError):
    """Misuse of the driver or a device that cannot do what was asked."""


class JobError(DriverError):
    """A job ended in an NPU error (the device was reset and other jobs go on)."""

    def __init__(self, msg: str, code: ErrorCode = ErrorCode.NONE, pc: int = 0):
        super().__init__(msg)
        self.code, self.pc = code, pc


def make_transport(backend: str, cfg: NpuConfig, **kw) -> Transport:
    if backend == "model":
        return ModelTransport(cfg)
    if backend == "rtl":
        from .rtl import RtlTransport

        return RtlTransport(cfg, **kw)
    if backend == "serial":
        from .serial import SerialTransport

        return SerialTransport(cfg, **kw)
    raise DriverError(f"unknown backend {backend!r}; choose model, rtl or serial")


@dataclass(eq=False)
class LoadedModel:
    npu: Npu
    name: str
    manifest: Manifest
    host: HostSteps
    region: tuple[int, int]
    save_addr: int
    points: dict[int, CancelPoint]
    loaded: bool = True

    @property
    def program_base(self) -> int:
        return self.manifest.program.base

    def submit(self, *inputs: np.ndarray, **kw) -> Job:
        return self.npu.submit(self, list(inputs), **kw)

    def run(self, *inputs: np.ndarray, **kw) -> list[np.ndarray]:
        """Run to completion (at NORMAL priority unless given) and return the float outputs."""
        return self.submit(*inputs, **kw).result()

    def unload(self) -> None:
        """Return the model's DRAM to the device (refused while one of its jobs is unfinished)."""
        self.npu.unload(self)

    def __enter__(self) -> LoadedModel:
        return self

    def __exit__(self, *exc) -> None:
        if self.loaded:
            self.unload()


@dataclass
class Preemption:
    cp: int
    requested: int  # cycle the pause was requested
    paused: int  # cycle the core reached PAUSED
    live_bytes: int
    dump_cycles: int
    restore_cycles: int = 0
    by: int = -1  # id of the job that preempted

    @property
    def pause_latency(self) -> int:
        return self.paused - self.requested


@dataclass(eq=False)
class Job:
    npu: Npu
    id: int
    model: LoadedModel
    inputs: list[np.ndarray]
    priority: int
    arrival: int
    timeout_cycles: int | None = None
    int8: bool = False
    on_done: Callable[[Job], None] | None = None
    state: str = "pending"  # pending, ready, running, paused, done, failed
    seg: int = 0
    resume_pc: int | None = None
    saved: list[tuple[int, int, int]] = field(default_factory=list)  # (on-chip start, length, save addr)
    env: dict = field(default_factory=dict)
    outputs: list[np.ndarray] | None = None
    error: Exception | None = None
    started: int | None = None
    finished: int | None = None
    used_cycles: int = 0
    counters: dict[str, int] = field(default_factory=dict)  # performance counters summed over its runs
    preemptions: list[Preemption] = field(default_factory=list)

    def done(self) -> bool:
        return self.state in ("done", "failed")

    @property
    def latency(self) -> int | None:
        return None if self.finished is None else self.finished - self.arrival

    def result(self, timeout_s: float | None = None) -> list[np.ndarray]:
        """Drive the device until this job ends; its outputs, or the error it ended with.

        Any thread may call it; threads take turns driving the device, one scheduling step each."""
        self.npu._pump(self, timeout_s)
        if self.error is not None:
            raise self.error
        return self.outputs


def _check_cycles(what: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise DriverError(f"{what} must be an integer number of cycles, got {value!r}")
    if value < minimum:
        raise DriverError(f"{what} must be >= {minimum}, got {value}")
    return int(value)


class Npu:
    """One device: loaded models, a job scheduler with priorities and preemption, and its trace.

    Thread-safe: every public method and `Job.result` may be called from any thread (one lock
    serialises device access; a scheduling step is atomic). Usable as a context manager (closes the
    transport)."""

    def __init__(
        self,
        backend: str = "model",
        config: str | NpuConfig = "default",
        *,
        transport: Transport | None = None,
        preempt: bool = True,
        trace: Trace | None = None,
        **transport_args,
    ):
        self.cfg = get_config(config)
        self.tr = transport or make_transport(backend, self.cfg, **transport_args)
        self.backend = backend
        self.preempt = preempt
        self.trace = trace if trace is not None else Trace(self.cfg.clock_mhz)
        if self.tr.reg("ID") != NPU_MAGIC:
            raise DriverError(
                f"no NPU answers on the {backend} backend (ID register 0x{self.tr.reg('ID'):08x})"
            )
        dev_id = self.tr.reg("CONFIG_ID")
        if dev_id != self.cfg.config_id:
            raise DriverError(
                f"the device is configuration 0x{dev_id:08x}, the driver was opened for "
                f"{self.cfg.name} (0x{self.cfg.config_id:08x})"
            )
        self.dram_bytes = min(self.cfg.dram_bytes, getattr(self.tr, "dram_bytes", self.cfg.dram_bytes))
        self.models: list[LoadedModel] = []
        self.jobs: list[Job] = []
        self.aux_bytes = min(AUX_BYTES, self.dram_bytes // 16)
        top = self.dram_bytes // PAGE * PAGE
        self._free: list[tuple[int, int]] = [(round_up(self.aux_bytes, PAGE), top)]  # sorted, disjoint
        self._ready: list[tuple[int, int, Job]] = []  # (-priority, id, job)
        self._arrivals: list[tuple[int, int, Job]] = []
        self._timers: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0
        self._job_ids = itertools.count()
        self._lock = threading.RLock()
        self.current: Job | None = None
        self._run_start = 0
        self._deadline: int | None = None  # the driver-kept end of a budget beyond TIMEOUT's range
        self._pause_req: tuple[int, Job | None] | None = None  # (cycle, preempting job)
        self._recover_if_needed("open")

    def __enter__(self) -> Npu:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the transport (the simulation, the serial port)."""
        with self._lock:
            self.tr.close()

    @contextmanager
    def _locked(self, timeout_s: float | None = None) -> Iterator[None]:
        if not self._lock.acquire(timeout=-1 if timeout_s is None else max(0.0, timeout_s)):
            raise TimeoutError(f"the device stayed busy in another thread for {timeout_s} s")
        try:
            yield
        finally:
            self._lock.release()

    # -- loading ----------------------------------------------------------------------------------
    def load(self, program: Container | str | Path, name: str | None = None) -> LoadedModel:
        """Place a compiled model in DRAM (weights, program, save area); returns its handle."""
        if isinstance(program, Container):
            c = program
        else:
            if Path(program).is_dir():
                raise DriverError(f"{program}: is a directory, not a compiled model (.npub)")
            c = Container.load(program)
        if c.config_id != self.cfg.config_id:
            raise DriverError(
                f"{name or c.manifest.config}: compiled for configuration 0x{c.config_id:08x} "
                f"({c.manifest.config}), the device is {self.cfg.name} (0x{self.cfg.config_id:08x})"
            )
        man = c.manifest
        prog = c.blobs["program"]
        end = man.program.base + len(prog)
        save_bytes = max([p.live_bytes for p in man.cancel_points] + [0])
        # pages keep the layout independent of the offset: the same size wherever the model lands
        size = round_up(round_up(end, 64) + save_bytes, PAGE)
        with self._lock:
            off = self._alloc(size)
            if off is None:
                free = sum(e - s for s, e in self._free)
                biggest = max([e - s for s, e in self._free] + [0])
                raise DriverError(
                    f"{name or 'model'}: needs {size} bytes of DRAM, {free} are free "
                    f"(the largest free range is {biggest} bytes); unload a model first"
                )
            try:
                man, prog = relocate(man, prog, off)
                for d in man.dram:
                    self.tr.write_dram(d.addr, c.blobs[d.blob])
                self.tr.write_dram(man.program.base, prog)
            except BaseException:
                self._release_range(off, off + size)
                raise
            name = name or f"model{len(self.models)}"
            lm = LoadedModel(
                self, name, man, HostSteps(c.blobs, man.segments), (off, off + size),
                round_up(off + end, 64), man.point_table(),
            )  # fmt: skip
            self.models.append(lm)
            return lm

    def unload(self, model: LoadedModel) -> None:
        """Return a model's DRAM; refused while one of its jobs is unfinished."""
        with self._lock:
            if model.npu is not self or not model.loaded:
                raise DriverError(f"model {model.name} is not loaded on this device")
            busy = [j.id for j in self.jobs if j.model is model and not j.done()]
            if busy:
                raise DriverError(f"model {model.name} has unfinished jobs {busy}; wait for them first")
            model.loaded = False
            self.models.remove(model)
            self.jobs = [j for j in self.jobs if j.model is not model]
            self._release_range(*model.region)

    def _alloc(self, size: int) -> int | None:
        for i, (s, e) in enumerate(self._free):  # first fit
            if e - s >= size:
                self._free[i : i + 1] = [(s + size, e)] if e - s > size else []
                return s
        return None

    def _release_range(self, start: int, end: int) -> None:
        self._free.append((start, end))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for s, e in self._free:
            if merged and merged[-1][1] == s:
                merged[-1] = (merged[-1][0], e)
            else:
                merged.append((s, e))
        self._free = merged

    # -- jobs -------------------------------------------------------------------------------------
    def submit(
        self,
        model: LoadedModel,
        inputs: list[np.ndarray],
        priority: int = Priority.NORMAL,
        *,
        at: int | None = None,
        timeout_cycles: int | None = None,
        int8: bool = False,
        allow_nonfinite: bool = False,
        on_done: Callable[[Job], None] | None = None,
    ) -> Job:
        """Queue a job; it becomes ready at device cycle `at` (default: now). Returns its future.

        Inputs with NaN or infinity are refused unless `allow_nonfinite` (they would quantise to
        arbitrary int8 values)."""
        if model.npu is not self:
            raise DriverError(f"model {model.name} was loaded on another device")
        if not model.loaded:
            raise DriverError(f"model {model.name} was unloaded")
        if isinstance(priority, bool) or not isinstance(priority, numbers.Integral):
            raise DriverError(f"priority must be a Priority or an integer, got {priority!r}")
        if at is not None:
            at = _check_cycles("at", at, minimum=0)
        if timeout_cycles is not None:
            timeout_cycles = _check_cycles("timeout_cycles", timeout_cycles, minimum=1)
        try:
            xs = check_inputs(model.manifest, inputs, allow_nonfinite=allow_nonfinite)
        except ValueError as e:
            raise DriverError(f"{model.name}: {e}") from None
        with self._lock:
            self._recover_if_needed("submit")
            now = self.tr.now()
            arrival = now if at is None else max(now, at)
            job = Job(
                self, next(self._job_ids), model, xs, int(priority), arrival, timeout_cycles, int8, on_done
            )
            self.jobs.append(job)
            heapq.heappush(self._arrivals, (job.arrival, job.id, job))
            self.trace.instant("submit", job, now)
            return job

    def at(self, cycle: int, fn: Callable[[], None]) -> None:
        """Call `fn` when the device clock reaches `cycle` (host work in the device timeline)."""
        cycle = _check_cycles("cycle", cycle, minimum=0)
        with self._lock:
            self._seq += 1
            heapq.heappush(self._timers, (cycle, self._seq, fn))

    def run_all(self, timeout_s: float | None = None) -> None:
        """Drive the device until no job or timer is left."""
        self._pump(None, timeout_s)

    def run_until(self, cond: Callable[[], bool], timeout_s: float | None = None) -> None:
        """Drive the device until `cond()` holds (checked between scheduling steps)."""
        self._pump(None, timeout_s, cond)

    def pause(self, job: Job) -> None:
        """Stop a running job at its next cancellation point (it stays queued to resume)."""
        with self._lock:
            if job is not self.current:
                raise DriverError(f"job {job.id} is not running (it is {job.state})")
            self._request_pause(None)

    def resume(self, job: Job) -> None:
        """Make a paused job ready again (jobs paused by preemption resume on their own)."""
        with self._lock:
            if job.state != "paused":
                raise DriverError(f"job {job.id} ({job.model.name}) was never paused: it is {job.state}")
            job.state = "ready"
            heapq.heappush(self._ready, (-job.priority, job.id, job))

    def counters(self) -> dict[str, int]:
        """The performance counters of the last run (docs/registers.md)."""
        with self._lock:
            return {name: self.tr.counter(name) for name in COUNTERS}

    def soft_reset(self) -> None:
        with self._lock:
            self.tr.set_reg("CONTROL", int(Control.SOFT_RESET))

    def run_raw(self, program: bytes, max_cycles: int = 1_000_000) -> Status:
        """Run a bare program from the driver's area (diagnostics); returns the final status."""
        with self._lock:
            if self.current is not None:
                raise DriverError("a job is running")
            if len(program) > self.aux_bytes:
                raise DriverError(
                    f"program of {len(program)} bytes exceeds the {self.aux_bytes}-byte driver area"
                )
            self.tr.write_dram(0, program)
            self.tr.set_reg("PROGRAM_BASE", 0)
            self.tr.set_reg("RESUME_PC", 0)
            self.tr.set_reg("TIMEOUT", 0)
            self.tr.set_reg("IRQ", 1)
            self.tr.set_reg("CONTROL", int(RUN))
            self.tr.wait(max_cycles)
            st = self.tr.status()
            self.tr.set_reg("IRQ", 1)
            return st

    # -- the scheduler ----------------------------------------------------------------------------
    def _pump(
        self, until: Job | None, timeout_s: float | None, cond: Callable[[], bool] | None = None
    ) -> None:
        t_end = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = None if t_end is None else t_end - time.monotonic()
            with self._locked(left):
                if (until is not None and until.done()) or (cond is not None and cond()):
                    return
                if t_end is not None and time.monotonic() > t_end:
                    raise TimeoutError(
                        f"job {until.id if until else '-'} not finished after {timeout_s} s of wall "
                        f"time (device cycle {self.tr.now()})"
                    )
                if not self._step(until, cond):
                    return

    def _step(self, until: Job | None, cond: Callable[[], bool] | None) -> bool:
        """One scheduling step (under the lock); False when nothing is left to do."""
        now = self.tr.now()
        self._release(now)
        if self.current is None:
            job = self._pick()
            if job is not None:
                self._guarded(job, "start", self._launch, job)
                return True
            nxt = self._next_event()
            if nxt is None:
                if until is not None:
                    raise DriverError(f"job {until.id} cannot finish: nothing is left to run")
                if cond is not None:
                    raise DriverError("the condition cannot become true: nothing is left to run")
                return False
            self.tr.wait(max(1, nxt - now))
            return True
        job = self.current
        if self.preempt and self._pause_req is None:
            top = self._peek()
            if top is not None and top.priority > job.priority:
                self._guarded(job, "pause request", self._request_pause, top)
                if self.current is None:
                    return True
        self._guarded(job, "run", self._wait_running, now)
        return True

    def _wait_running(self, now: int) -> None:
        nxt = self._next_event()
        if self._deadline is not None:
            nxt = self._deadline if nxt is None else min(nxt, self._deadline)
        self.tr.wait(None if nxt is None else max(1, nxt - now))
        st = self.tr.status()
        if st != Status.RUNNING:
            self._stopped(st)
        elif self._deadline is not None and self.tr.now() >= self._deadline:
            job = self.current
            self._account(job)
            self.soft_reset()
            self._fail(job, JobError(self._timeout_text(job), ErrorCode.TIMEOUT))

    def _guarded(self, job: Job, phase: str, fn: Callable, *args) -> None:
        """Run a step of `job`; if anything raises, the job fails with the error and the device is
        reset, so the other jobs and the `Npu` go on."""
        try:
            fn(*args)
        except Exception as e:
            e.add_note(f"(job {job.id}, model {job.model.name}, during {phase})")
            self.current, self._pause_req, self._deadline = None, None, None
            try:
                self.soft_reset()
                self.tr.set_reg("IRQ", 1)
            except Exception as reset_error:  # the link itself may be down: the next call reports it
                e.add_note(f"the device could not be reset afterwards: {reset_error}")
            if not job.done():
                self._fail(job, e)

    def _release(self, now: int) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, fn = heapq.heappop(self._timers)
            fn()
        while self._arrivals and self._arrivals[0][0] <= now:
            _, _, job = heapq.heappop(self._arrivals)
            job.state = "ready"
            heapq.heappush(self._ready, (-job.priority, job.id, job))

    def _next_event(self) -> int | None:
        ts = [q[0][0] for q in (self._timers, self._arrivals) if q]
        return min(ts) if ts else None

    def _busy_models(self) -> set[int]:
        """Models with a started, unfinished job: their activation area is taken."""
        return {id(j.model) for j in self.jobs if j.started is not None and not j.done()}

    def _peek(self) -> Job | None:
        busy = self._busy_models()
        for _, _, j in sorted(self._ready):
            if j.state == "ready" and (id(j.model) not in busy or j.started is not None):
                return j
        return None

    def _pick(self) -> Job | None:
        j = self._peek()
        if j is not None:
            self._ready = [e for e in self._ready if e[2] is not j]
            heapq.heapify(self._ready)
        return j

    def _launch(self, job: Job) -> None:
        """Start or continue a job: inputs, host steps, restore, then its next NPU segment."""
        now = self.tr.now()
        segs = job.model.manifest.segments
        if job.started is None:
            job.started = now
            write_inputs(job.model.manifest, self.tr, job.inputs, job.env)
        while job.seg < len(segs) and isinstance(segs[job.seg], HostStep):
            t0 = time.perf_counter()
            job.model.host.run(self.tr, segs[job.seg], job.env)
            self.trace.span("host", job, now, now, info=f"{time.perf_counter() - t0:.6f} s on the host")
            job.seg += 1
        if job.seg == len(segs):
            self._finish(job)
            return
        if job.saved:
            p = job.preemptions[-1]
            t0 = self.tr.now()
            p.restore_cycles = self._run_aux([("load", s, n, a) for s, n, a in job.saved])
            self.trace.span("restore", job, t0, self.tr.now())
            job.saved = []
        self.current = job
        job.state = "running"
        pc = job.resume_pc if job.resume_pc is not None else segs[job.seg].pc
        self.tr.set_reg("PROGRAM_BASE", job.model.program_base)
        self.tr.set_reg("RESUME_PC", pc)
        budget = 0 if job.timeout_cycles is None else max(1, job.timeout_cycles - job.used_cycles)
        self.tr.set_reg("TIMEOUT", budget if budget <= TIMEOUT_MAX else 0)
        self.tr.set_reg("IRQ", 1)
        self._run_start = self.tr.now()
        self._deadline = self._run_start + budget if budget > TIMEOUT_MAX else None
        self.tr.set_reg("CONTROL", int(RUN))
        self.trace.instant(
            "start" if job.resume_pc is None and job.seg == 0 else "resume", job, self._run_start
        )

    def _request_pause(self, by: Job | None) -> None:
        self._pause_req = (self.tr.now(), by)
        self.tr.set_reg("CONTROL", int(Control.PAUSE | Control.IRQ_ENABLE))
        self.trace.instant("pause request", self.current, self._pause_req[0])

    def _account(self, job: Job) -> None:
        """Add the run's counters to the job's and close its trace span."""
        for name, v in self.counters().items():
            job.counters[name] = job.counters.get(name, 0) + v
        job.used_cycles = job.counters["CYCLES"]
        self.trace.span("run", job, self._run_start, self.tr.now())
        self.current, self._deadline = None, None

    def _timeout_text(self, job: Job) -> str:
        return f"job {job.id} ({job.model.name}) exceeded its timeout of {job.timeout_cycles} cycles"

    def _stopped(self, st: Status) -> None:
        job = self.current
        now = self.tr.now()
        self._account(job)
        req, self._pause_req = self._pause_req, None
        self.tr.set_reg("IRQ", 1)
        if st == Status.DONE:
            job.seg += 1
            job.resume_pc = None
            if job.seg < len(job.model.manifest.segments):
                job.state = "ready"  # between segments nothing is on chip: yield to anyone ready
                heapq.heappush(self._ready, (-job.priority, job.id, job))
            else:
                self._finish(job)
        elif st == Status.PAUSED:
            cp = self.tr.reg("CP_ID")
            job.resume_pc = self.tr.reg("RESUME_PC")
            self.trace.instant("paused", job, now, f"point {cp}, resume pc {job.resume_pc}")
            point = job.model.points.get(cp)
            if point is None:
                self._fail(job, JobError(f"job {job.id} ({job.model.name}) paused at unknown point {cp}"))
                return
            ranges = [(s, e - s) for s, e in point.live_ranges]
            saved, a = [], job.model.save_addr
            for s, n in ranges:
                saved.append((s, n, a))
                a += n
            t0 = self.tr.now()
            dump = self._run_aux([("store", s, n, sa) for s, n, sa in saved]) if saved else 0
            self.trace.span("dump", job, t0, self.tr.now(), f"{point.live_bytes} bytes")
            job.saved = saved
            job.preemptions.append(
                Preemption(cp, req[0] if req else now, now, point.live_bytes, dump,
                           by=req[1].id if req and req[1] else -1)
            )  # fmt: skip
            job.state = "paused"
            if req is not None and req[1] is not None:  # preempted: it resumes on its own later
                job.state = "ready"
                heapq.heappush(self._ready, (-job.priority, job.id, job))
        else:
            code = ErrorCode(self.tr.reg("ERROR_CODE"))
            pc = self.tr.reg("ERROR_PC")
            if code == ErrorCode.TIMEOUT and job.timeout_cycles is not None:
                msg = self._timeout_text(job)
            else:
                msg = f"job {job.id} ({job.model.name}) ended in NPU error {code.name} at pc {pc}"
            self.soft_reset()
            self._fail(job, JobError(msg, code, pc))

    def _finish(self, job: Job) -> None:
        outs = read_outputs(job.model.manifest, self.tr, job.env, job.int8)
        job.outputs = outs
        self._end(job, "done")

    def _fail(self, job: Job, err: Exception) -> None:
        job.error = err
        self._end(job, "failed")

    def _end(self, job: Job, state: str) -> None:
        job.state = state
        job.finished = self.tr.now()
        job.env = {}  # the host tensors are not needed any more
        self.trace.instant(state, job, job.finished)
        if job.on_done:
            try:
                job.on_done(job)
            except Exception as e:  # the callback is part of the job: its error is the job's
                e.add_note(f"(raised by the on_done callback of job {job.id}, model {job.model.name})")
                job.state, job.error, job.outputs = "failed", e, None

    def _run_aux(self, moves: list[tuple[str, int, int, int]]) -> int:
        """Run a driver program of LOADs or STOREs (op, on-chip addr, bytes, DRAM addr); its cycles."""
        b = ProgramBuilder(self.cfg)
        for op, s, n, a in moves:
            for ins in copy_range(op, s, n, a):
                b.add(ins)
        st = self.run_raw(encode_program(b.build().instrs), max_cycles=10_000_000)
        if st != Status.DONE:
            code = ErrorCode(self.tr.reg("ERROR_CODE"))
            self.soft_reset()
            raise DriverError(f"the driver's {moves[0][0]} program failed: {st.name} {code.name}")
        return self.tr.counter("CYCLES")

    def _recover_if_needed(self, when: str) -> None:
        st = self.tr.status()
        if st == Status.ERROR and self.current is None:
            code = ErrorCode(self.tr.reg("ERROR_CODE"))
            self.soft_reset()
            self.trace.instant(f"recovered from {code.name} ({when})", None, self.tr.now())
