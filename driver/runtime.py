"""The runtime API: `Npu(backend=...)`, `load(program) -> LoadedModel`, `model.run(inputs)`,
`submit(...) -> Job`, priorities and preemption at cancellation points, on one engine or on the
engines of a SoC.

Scheduling is event driven in device time (cycles). A job is a graph of program segments (a chain,
or with `--granularity operator` one segment per operator and the operator graph); a segment whose
inputs exist is a unit of work (`sched.Operator`) handed to the dispatcher: one shared priority queue
(`dispatch="shared"`, the default) or one operator queue per engine with a policy (operator queues:
`expected-time`, `count`, `round-robin`). With `enqueue="submit"` (the design's setting) every NPU
segment of a job goes to a queue when the job starts, in dependency order, and a queue whose head
still waits for its inputs holds its engine (the synchronisation between queues the design describes).
A free engine starts what its queue holds first; a unit that waits with a higher priority than the
one an engine runs preempts it:

1. the driver sets PAUSE on that engine; it stops at its next cancellation point (a segment that
   reaches END first is simply waited for);
2. the driver reads CP_ID, RESUME_PC and RESUME_TOKENS and dumps that point's live on-chip ranges
   into a save area with a driver-generated program of STOREs run by the engine itself;
3. the urgent unit runs; later the preempted one's ranges are restored (on whichever engine takes it)
   by a program of LOADs and it resumes at the saved PC with the saved tokens. Preemption nests.

Between two segments nothing is on chip, so a job yields there for free. Host steps run on the host as
soon as their inputs exist.
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
from npu.container import CancelPoint, Container, HostStep, Manifest, NpuSegment, relocate
from npu.errors import NpuError
from npu.executor import HostSteps, check_inputs, read_outputs, write_inputs
from npu.isa import ErrorCode, encode_program
from npu.manifest_check import check_container
from npu.program import ProgramBuilder, copy_range
from npu.registers import COUNTERS, NPU_MAGIC, SOC_MAGIC, Control, Status

from .memory import DeviceMemory
from .resolve import resolve
from .sched import Operator, make_dispatch
from .trace import Trace
from .transport import EngineView, ModelTransport, SocModelTransport, Transport

AUX_BYTES = 0x10000  # DRAM reserved at address 0 for the driver's dump and restore programs (at most)
RUN = Control.START | Control.IRQ_ENABLE
#: cycles a bare program's run waits between status reads (run_raw)
RAW_WAIT_QUANTUM = 1 << 14
TIMEOUT_MAX = 0xFFFF_FFFF  # the TIMEOUT register's range; longer budgets are kept by the driver
PAGE = 4096  # models are placed on DRAM pages
#: with a wall-clock timeout, no single wait is longer than this many cycles: an engine that never
#: stops (a hung device) ends in TimeoutError instead of a wait that never returns
TIMED_WAIT_CYCLES = 1 << 20
#: when a job's NPU segments reach the operator queues: once their inputs exist, or all at its start
ENQUEUE_MODES = ("ready", "submit")


class Priority(enum.IntEnum):
    LOW = 0
    NORMAL = 1
    HIGH = 2
    URGENT = 3

    @classmethod
    def of(cls, value: object, *, names: bool = False, members_only: bool = False) -> int:
        """The one priority check: a Priority or an integer (`members_only`: one of the members;
        `names`: also a member's name, such as "high"); ValueError naming what is accepted."""
        if names and isinstance(value, str):
            try:
                return int(cls[value.upper()])
            except KeyError:
                choices = ", ".join(p.name.lower() for p in cls)
                raise ValueError(f"unknown priority {value!r} (one of {choices}, or an integer)") from None
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            what = "a name" if names else "a Priority"
            raise ValueError(f"priority must be {what} or an integer, got {value!r}")
        if members_only and value not in set(cls):
            raise ValueError(f"priority must be one of {[p.name for p in cls]}, got {value!r}")
        return int(value)


class DriverError(NpuError, RuntimeError):
    """Misuse of the driver or a device that cannot do what was asked."""


class JobError(DriverError):
    """A job ended in an NPU error (the engine was reset and other jobs go on)."""

    def __init__(self, msg: str, code: ErrorCode = ErrorCode.NONE, pc: int = 0):
        super().__init__(msg)
        self.code, self.pc = code, pc


#: transports by backend name, as "module:class": the RTL one belongs to the verification harness
#: above the driver (npu.sim.rtl), so it is named here and imported only when asked for
BACKENDS = {"rtl": "npu.sim.rtl.transport:RtlTransport", "serial": "npu.driver.serial:SerialTransport"}


def make_transport(backend: str, cfg: NpuConfig, **kw) -> Transport:
    if backend == "model":
        return SocModelTransport(cfg) if cfg.engines > 1 else ModelTransport(cfg)
    if backend not in BACKENDS:
        raise DriverError(f"unknown backend {backend!r}; choose model, {' or '.join(BACKENDS)}")
    return resolve(BACKENDS[backend])(cfg, **kw)


@dataclass(eq=False)
class Instance:
    """One placement of a model in DRAM: its relocated manifest, DRAM range and save area."""

    manifest: Manifest
    region: tuple[int, int]
    save_addr: int
    save_busy: bool = False
    job: Job | None = None  # the started, unfinished job using its activations

    @property
    def program_base(self) -> int:
        return self.manifest.program.base


@dataclass(eq=False)
class LoadedModel:
    npu: Npu
    name: str
    manifest: Manifest
    host: HostSteps
    instances: list[Instance]
    points: dict[int, CancelPoint]
    deps: list[list[int]]  # per segment, the segments it reads from
    loaded: bool = True

    @property
    def region(self) -> tuple[int, int]:
        return self.instances[0].region

    @property
    def save_addr(self) -> int:
        return self.instances[0].save_addr

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
    paused: int  # cycle the engine reached PAUSED
    live_bytes: int
    dump_cycles: int
    restore_cycles: int = 0
    by: int = -1  # id of the job that preempted
    segment: int = 0
    engine: int = 0

    @property
    def pause_latency(self) -> int:
        return self.paused - self.requested


@dataclass
class _Saved:
    """A segment stopped at a cancellation point: where to resume and what was dumped where."""

    resume_pc: int
    tokens: list[int]  # RESUME_TOKENS0..2 at the pause: the channels' counts the resume restores
    ranges: list[tuple[int, int, int]]  # (on-chip start, length, save addr)
    area: tuple[int, int] | None  # DRAM [start, end) taken for the dump (None: the instance's)
    preemption: Preemption


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
    inst: Instance | None = None
    done_segs: set[int] = field(default_factory=set)
    queued: set[int] = field(default_factory=set)  # segments handed to the dispatcher, not done
    saved: dict[int, _Saved] = field(default_factory=dict)  # segments stopped at a point
    held: list[tuple[Operator, int]] = field(default_factory=list)  # paused by `Npu.pause`
    env: dict = field(default_factory=dict)
    outputs: list[np.ndarray] | None = None
    error: Exception | None = None
    admitted: int | None = None  # took a model instance: inputs written, segments dispatched
    started: int | None = None  # its first segment started on an engine
    finished: int | None = None
    used_cycles: int = 0
    counters: dict[str, int] = field(default_factory=dict)  # performance counters summed over its runs
    preemptions: list[Preemption] = field(default_factory=list)
    segment_cycles: dict[int, int] = field(default_factory=dict)  # cycles each segment ran, summed
    engines_used: set[int] = field(default_factory=set)

    def done(self) -> bool:
        return self.state in ("done", "failed")

    @property
    def manifest(self) -> Manifest:
        return self.inst.manifest if self.inst is not None else self.model.manifest

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


@dataclass(eq=False)
class Engine:
    """One engine's registers (a transport view) and what the driver runs on it."""

    index: int
    tr: Transport
    unit: Operator | None = None
    run_start: int = 0
    deadline: int | None = None  # the driver-kept end of a budget beyond TIMEOUT's range
    pause_req: tuple[int, Job | None] | None = None  # (cycle, preempting job)
    busy_cycles: int = 0  # cycles it ran jobs' segments


def _check_cycles(what: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise DriverError(f"{what} must be an integer number of cycles, got {value!r}")
    if value < minimum:
        raise DriverError(f"{what} must be >= {minimum}, got {value}")
    return int(value)


class Npu:
    """One device of one or more engines: loaded models, a scheduler with priorities and
    preemption, and its trace.

    `config` a SoC preset (`duo`) or `engines=N` gives N engines; `dispatch` chooses how ready units
    of work reach them: "shared" (one priority queue) or an operator-queue policy ("expected-time",
    "count", "round-robin"); `enqueue` when a job's segments are queued: "ready" (once their inputs
    exist) or "submit" (all of them when the job starts; a queue's head waits for its inputs, the
    seed's synchronisation between queues). Thread-safe: every public method and `Job.result` may be
    called from any thread (one lock serialises device access; a scheduling step is atomic). Usable
    as a context manager (closes the transport)."""

    def __init__(
        self,
        backend: str = "model",
        config: str | NpuConfig = "default",
        *,
        transport: Transport | None = None,
        preempt: bool = True,
        trace: Trace | None = None,
        engines: int | None = None,
        dispatch: str = "shared",
        enqueue: str = "ready",
        history: int = 1000,
        **transport_args,
    ):
        cfg = get_config(config)
        if engines is not None:
            if isinstance(engines, bool) or not isinstance(engines, int) or engines < 1:
                raise DriverError(f"engines must be a positive integer, got {engines!r}")
            cfg = cfg.replace(engines=engines)
        self.cfg = cfg
        self.tr = transport or make_transport(backend, self.cfg, **transport_args)
        self.backend = backend
        self.preempt = preempt
        self.trace = trace if trace is not None else Trace(self.cfg.clock_mhz)
        self.trace.engines = self.cfg.engines
        if self.cfg.engines > 1:
            soc_id = self.tr.read_reg(0)
            if soc_id != SOC_MAGIC:
                raise DriverError(f"no NPU SoC answers on the {backend} backend (SOC_ID 0x{soc_id:08x})")
            n = self.tr.read_reg(0x0C)
            if n != self.cfg.engines:
                raise DriverError(f"the SoC has {n} engines, the driver was opened for {self.cfg.engines}")
            views = [EngineView(self.tr, i) for i in range(self.cfg.engines)]
        else:
            views = [self.tr]
        self.engines = [Engine(i, v) for i, v in enumerate(views)]
        one = self.cfg.engine
        for e in self.engines:
            if e.tr.reg("ID") != NPU_MAGIC:
                raise DriverError(
                    f"no NPU answers on the {backend} backend (engine {e.index} ID register "
                    f"0x{e.tr.reg('ID'):08x})"
                )
            dev_id = e.tr.reg("CONFIG_ID")
            if dev_id != one.config_id:
                raise DriverError(
                    f"the device is configuration 0x{dev_id:08x}, the driver was opened for "
                    f"{one.name} (0x{one.config_id:08x})"
                )
        try:
            self.dispatch = make_dispatch(dispatch, self.cfg.engines)
        except ValueError as e:
            raise DriverError(f"dispatch: {e}; or 'shared'") from None
        if enqueue not in ENQUEUE_MODES:
            raise DriverError(f"enqueue must be one of {', '.join(ENQUEUE_MODES)}, got {enqueue!r}")
        if enqueue == "submit" and dispatch == "shared":
            raise DriverError("enqueue='submit' needs per-engine operator queues: choose a dispatch policy")
        self.enqueue = enqueue
        self.dram_bytes = min(self.cfg.dram_bytes, getattr(self.tr, "dram_bytes", self.cfg.dram_bytes))
        self.models: list[LoadedModel] = []
        # unfinished jobs and the last `history` finished ones (a long-running service stays bounded)
        self.jobs: list[Job] = []
        if isinstance(history, bool) or not isinstance(history, int) or history < 0:
            raise DriverError(f"history must be a number of finished jobs >= 0, got {history!r}")
        self.history = history
        self.closed = False
        self.aux_bytes = min(AUX_BYTES, self.dram_bytes // 16)
        top = self.dram_bytes // PAGE * PAGE
        self.memory = DeviceMemory(round_up(self.aux_bytes, PAGE), top)  # the models' DRAM
        self._waiting: list[tuple[int, int, Job]] = []  # arrived, not started: (-priority, id, job)
        self._admit_dirty = False  # an arrival or a freed instance since the last admission pass
        self._arrivals: list[tuple[int, int, Job]] = []
        self._timers: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0
        self._job_ids = itertools.count()
        self._lock = threading.RLock()
        # None: a driver step waits for the next event; N: at most N cycles, so that jobs submitted
        # from other threads (pipeline runners) arrive, and preempt, while a long job runs
        self.wait_quantum: int | None = None
        for e in self.engines:
            self._recover_if_needed("open", e)

    def __enter__(self) -> Npu:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the transport (the simulation, the serial port); the device takes no more work."""
        with self._lock:
            self.closed = True
            self.tr.close()

    def _check_open(self) -> None:
        if self.closed:
            raise DriverError("the device is closed (Npu.close); open a new Npu")

    @property
    def current(self) -> Job | None:
        """The job running on engine 0 (the only engine of a single-core device)."""
        u = self.engines[0].unit
        return None if u is None else u.job

    @contextmanager
    def _locked(self, timeout_s: float | None = None) -> Iterator[None]:
        if not self._lock.acquire(timeout=-1 if timeout_s is None else max(0.0, timeout_s)):
            raise TimeoutError(f"the device stayed busy in another thread for {timeout_s} s")
        try:
            yield
        finally:
            self._lock.release()

    # -- loading ----------------------------------------------------------------------------------
    def load(
        self, program: Container | str | Path, name: str | None = None, *, instances: int = 1
    ) -> LoadedModel:
        """Place a compiled model in DRAM (weights, program, save area); returns its handle.

        `instances` > 1 places that many copies, so as many jobs of the model can run at once (each
        job takes a free copy when it starts; otherwise jobs of one model run one after another)."""
        self._check_open()
        if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
            raise DriverError(f"instances must be a positive integer, got {instances!r}")
        if isinstance(program, Container):
            c = program
        else:
            if Path(program).is_dir():
                raise DriverError(f"{program}: is a directory, not a compiled model (.npub)")
            c = Container.load(program)
        one = self.cfg.engine
        if c.config_id != one.config_id:
            raise DriverError(
                f"{name or c.manifest.config}: compiled for configuration 0x{c.config_id:08x} "
                f"({c.manifest.config}), the device is {one.name} (0x{one.config_id:08x})"
            )
        # every address inside the model's own image, before anything is written (docs/container.md)
        check_container(c, one, name or "")
        man = c.manifest
        prog = c.blobs["program"]
        end = man.program.base + len(prog)
        save_bytes = max([p.live_bytes for p in man.cancel_points] + [0])
        # pages keep the layout independent of the offset: the same size wherever the model lands
        size = round_up(round_up(end, 64) + save_bytes, PAGE)
        with self._lock:
            placed: list[Instance] = []
            try:
                for _ in range(instances):
                    off = self.memory.alloc(size)
                    if off is None:
                        mem = self.memory
                        raise DriverError(
                            f"{name or 'model'}: needs {size} bytes of DRAM, {mem.free_bytes} are free (the "
                            f"largest free range is {mem.largest} bytes); unload a model first"
                        )
                    placed.append(Instance(man, (off, off + size), round_up(off + end, 64)))
                    m, p = relocate(man, prog, off)
                    placed[-1].manifest = m
                    for d in m.dram:
                        self.tr.write_dram(d.addr, c.blobs[d.blob])
                    self.tr.write_dram(m.program.base, p)
            except BaseException:
                for inst in placed:
                    self.memory.release(*inst.region)
                raise
            name = name or f"model{len(self.models)}"
            lm = LoadedModel(
                self, name, placed[0].manifest, HostSteps(c.blobs, man.segments), placed,
                man.point_table(), man.segment_deps(),
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
            for inst in model.instances:
                self.memory.release(*inst.region)

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
        if model.manifest.granularity == "step":
            raise DriverError(
                f"model {model.name} was compiled with granularity 'step': its segments continue on each "
                "other's on-chip data, which this runtime does not keep between segments; run it with "
                "the layer-wise scheduler (npu.driver.sched.layerwise), or compile it with granularity "
                "'segment' or 'operator'"
            )
        try:
            priority = Priority.of(priority)
        except ValueError as e:
            raise DriverError(str(e)) from None
        if at is not None:
            at = _check_cycles("at", at, minimum=0)
        if timeout_cycles is not None:
            timeout_cycles = _check_cycles("timeout_cycles", timeout_cycles, minimum=1)
        try:
            xs = check_inputs(model.manifest, inputs, allow_nonfinite=allow_nonfinite)
        except ValueError as e:
            raise DriverError(f"{model.name}: {e}") from None
        with self._lock:
            self._check_open()
            for e in self.engines:
                self._recover_if_needed("submit", e)
            now = self.tr.now()
            arrival = now if at is None else max(now, at)
            job = Job(
                self, next(self._job_ids), model, xs, int(priority), arrival, timeout_cycles, int8, on_done
            )
            self.jobs.append(job)
            if len(self.jobs) > 2 * self.history + 64:  # amortised: keep the last `history` finished
                done = [j for j in self.jobs if j.done()]
                keep = set(map(id, done[len(done) - self.history :] if self.history else []))
                self.jobs = [j for j in self.jobs if not j.done() or id(j) in keep]
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
        """Stop a running job at its next cancellation point (it stays paused until `resume`)."""
        with self._lock:
            engines = [e for e in self.engines if e.unit is not None and e.unit.job is job]
            if not engines:
                raise DriverError(f"job {job.id} is not running (it is {job.state})")
            for e in engines:
                if e.pause_req is None:
                    self._request_pause(e, None)

    def resume(self, job: Job) -> None:
        """Make a paused job ready again (jobs paused by preemption resume on their own)."""
        with self._lock:
            if job.state != "paused" or not job.held:
                raise DriverError(f"job {job.id} ({job.model.name}) was never paused: it is {job.state}")
            for op, e in job.held:
                self.dispatch.paused(op, e)
            job.held = []
            job.state = "ready"

    def counters(self, engine: int = 0) -> dict[str, int]:
        """The performance counters of an engine's last run (docs/registers.md)."""
        with self._lock:
            tr = self.engines[engine].tr
            return {name: tr.counter(name) for name in COUNTERS}

    def soft_reset(self, engine: int | None = None) -> None:
        """Reset one engine (None: every engine)."""
        with self._lock:
            for e in self.engines if engine is None else [self.engines[engine]]:
                e.tr.set_reg("CONTROL", int(Control.SOFT_RESET))

    def run_raw(self, program: bytes, max_cycles: int = 1_000_000, engine: int = 0) -> Status:
        """Run a bare program from the driver's area on an idle engine (diagnostics, dumps and
        restores); returns the final status."""
        with self._lock:
            e = self.engines[engine]
            if e.unit is not None:
                raise DriverError(f"a job is running on engine {engine}")
            if len(program) > self.aux_bytes:
                raise DriverError(
                    f"program of {len(program)} bytes exceeds the {self.aux_bytes}-byte driver area"
                )
            self.tr.write_dram(0, program)
            e.tr.set_reg("DRAM_BASE", 0)  # the driver's own program: no memory window
            e.tr.set_reg("DRAM_LIMIT", 0)
            e.tr.set_reg("PROGRAM_BASE", 0)
            e.tr.set_reg("RESUME_PC", 0)
            e.tr.set_resume_tokens([0, 0, 0])  # not a paused job's: they are saved with it
            e.tr.set_reg("TIMEOUT", 0)
            e.tr.set_reg("IRQ", 1)
            e.tr.set_reg("CONTROL", int(RUN))
            waited = 0
            while True:
                # in quanta: a WAIT that reaches a core already stopped (a short program, a slow
                # link) runs out its whole limit before it answers
                waited += self.tr.wait(min(self.wait_quantum or RAW_WAIT_QUANTUM, max_cycles - waited))
                st = e.tr.status()
                if st != Status.RUNNING or waited >= max_cycles:
                    break
            e.tr.set_reg("IRQ", 1)
            return st

    # -- the scheduler ----------------------------------------------------------------------------
    def _pump(
        self, until: Job | None, timeout_s: float | None, cond: Callable[[], bool] | None = None
    ) -> None:
        t_end = None if timeout_s is None else time.monotonic() + timeout_s
        bound = None if t_end is None else TIMED_WAIT_CYCLES
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
                if not self._step(until, cond, bound):
                    return
            if self.wait_quantum is not None:
                time.sleep(0)  # a thread waiting for the lock (a submission) gets its turn

    def _step(self, until: Job | None, cond: Callable[[], bool] | None, bound: int | None = None) -> bool:
        """One scheduling step (under the lock); False when nothing is left to do."""
        now = self.tr.now()
        self._release(now)
        progressed = self._admit()
        for e in self.engines:
            if e.unit is None and e.pause_req is None:
                op = self._next_unit(e)
                if op is not None:
                    self._guarded(op.job, "start", self._launch, e, op, engine=e)
                    progressed = True
        if progressed:
            return True
        running = [e for e in self.engines if e.unit is not None]
        if not running:
            nxt = self._next_event()
            if nxt is None:
                if until is not None:
                    raise DriverError(f"job {until.id} cannot finish: nothing is left to run")
                if cond is not None:
                    raise DriverError("the condition cannot become true: nothing is left to run")
                return False
            self.tr.wait(max(1, nxt - now))
            return True
        if self.preempt:
            self._preempt_for_waiting()
        self._wait_running(now, bound)
        return True

    def _next_unit(self, e: Engine) -> Operator | None:
        """The unit `e` starts next (units of jobs that ended meanwhile are dropped)."""
        while True:
            head = self.dispatch.peek(e.index)
            if head is not None and not head.job.done() and not self._inputs_exist(head):
                return None  # enqueued at submission: the head holds its queue until its inputs exist
            op = self.dispatch.next_for(e.index)
            if op is None or not op.job.done():
                return op
            self.dispatch.finished(op, e.index)

    def _inputs_exist(self, op: Operator) -> bool:
        job = op.job
        return all(d in job.done_segs for d in job.model.deps[op.payload])

    def _preempt_for_waiting(self) -> None:
        """Pause engines running a lower priority than a unit waiting for them (one engine at a
        time for the shared queue: the lowest-priority one)."""
        if self.dispatch.name == "shared":
            if any(e.pause_req is not None for e in self.engines):
                return
            top = self.dispatch.peek(0)
            if top is None:
                return
            cands = [e for e in self.engines if e.unit is not None and e.unit.priority < top.priority]
            if not cands:
                return
            e = min(cands, key=lambda e: (e.unit.priority, -e.run_start))
            self._guarded(e.unit.job, "pause request", self._request_pause, e, top.job, engine=e)
            return
        for e in self.engines:
            top = self.dispatch.peek(e.index)
            busy = e.unit is not None and e.pause_req is None
            if busy and top is not None and top.priority > e.unit.priority and self._inputs_exist(top):
                self._guarded(e.unit.job, "pause request", self._request_pause, e, top.job, engine=e)

    def _wait_running(self, now: int, bound: int | None = None) -> None:
        """Wait for the running engines (at most `bound` cycles: a run with a wall-clock timeout)."""
        nxt = self._next_event()
        for e in self.engines:
            if e.unit is not None and e.deadline is not None:
                nxt = e.deadline if nxt is None else min(nxt, e.deadline)
        limit = None if nxt is None else max(1, nxt - now)
        for q in (self.wait_quantum, bound):  # let other threads' submissions in while a
            if q is not None:  # job runs; see the wall clock while a hung engine never stops
                limit = q if limit is None else min(limit, q)
        try:
            self.tr.wait(limit)
        except Exception as err:
            for e in self.engines:
                if e.unit is not None:
                    self._on_error(e.unit.job, "run", err, e)
            return
        for e in self.engines:
            if e.unit is None:
                continue
            job = e.unit.job
            st = self._guarded(job, "run", e.tr.status, engine=e)
            if st is None:
                continue
            if st != Status.RUNNING:
                self._guarded(job, "stop", self._stopped, e, st, engine=e)
            elif e.deadline is not None and self.tr.now() >= e.deadline:
                self._guarded(job, "timeout", self._timeout, e, engine=e)

    def _timeout(self, e: Engine) -> None:
        job = e.unit.job
        self._account(e)
        self.soft_reset(e.index)
        self._fail(job, JobError(self._timeout_text(job), ErrorCode.TIMEOUT))

    def _guarded(self, job: Job, phase: str, fn: Callable, *args, engine: Engine | None = None):
        """Run a step of `job`; if anything raises, the job fails with the error and the engine is
        reset, so the other jobs and the `Npu` go on."""
        try:
            return fn(*args)
        except Exception as err:
            self._on_error(job, phase, err, engine)
            return None

    def _on_error(self, job: Job, phase: str, err: Exception, engine: Engine | None) -> None:
        err.add_note(f"(job {job.id}, model {job.model.name}, during {phase})")
        if engine is not None:
            self._stop_engine(engine, err)
        if not job.done():
            self._fail(job, err)

    def _stop_engine(self, e: Engine, err: Exception) -> None:
        """Drop what `e` runs and reset it (after `err`, which notes a reset that failed too)."""
        if e.unit is not None:
            self.dispatch.finished(e.unit, e.index)
        e.unit, e.pause_req, e.deadline = None, None, None
        try:
            e.tr.set_reg("CONTROL", int(Control.SOFT_RESET))
            e.tr.set_reg("IRQ", 1)
        except Exception as reset_error:  # the link itself may be down: the next call reports it
            err.add_note(f"engine {e.index} could not be reset afterwards: {reset_error}")

    def _release(self, now: int) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, fn = heapq.heappop(self._timers)
            fn()
        while self._arrivals and self._arrivals[0][0] <= now:
            _, _, job = heapq.heappop(self._arrivals)
            job.state = "ready"
            heapq.heappush(self._waiting, (-job.priority, job.id, job))
            self._admit_dirty = True

    def _next_event(self) -> int | None:
        ts = [q[0][0] for q in (self._timers, self._arrivals) if q]
        return min(ts) if ts else None

    def _admit(self) -> bool:
        """Start the arrived jobs that have a free model instance, by priority then arrival."""
        progressed = False
        if not self._waiting or not self._admit_dirty:
            return False
        self._admit_dirty = False
        now = self.tr.now()  # before anything is taken off the queue (a failing link loses nothing)
        keep = []
        while self._waiting:
            entry = heapq.heappop(self._waiting)
            job = entry[2]
            if job.done():
                continue
            inst = next((i for i in job.model.instances if i.job is None), None)
            if inst is None:
                keep.append(entry)
                continue
            progressed = True
            inst.job, job.inst, job.admitted = job, inst, now
            self._guarded(job, "start", self._start, job)
        for entry in keep:
            heapq.heappush(self._waiting, entry)
        return progressed

    def _start(self, job: Job) -> None:
        write_inputs(job.manifest, self.tr, job.inputs, job.env)
        if self.enqueue == "submit":
            segs = job.manifest.segments
            for i in _topological(job.model.deps):
                if isinstance(segs[i], NpuSegment):
                    self._submit_segment(job, i)
        self._advance(job)

    def _submit_segment(self, job: Job, i: int) -> None:
        job.queued.add(i)
        seg = job.manifest.segments[i]
        name = f"{job.model.name}#{job.id}:{i}"
        self.dispatch.submit(Operator(name, self._ref_cycles(seg), job, i, job.priority))

    def _ref_cycles(self, seg: NpuSegment) -> int:
        if seg.ref_cycles is not None:
            return seg.ref_cycles
        return seg.est_cycles or 0

    def _advance(self, job: Job) -> None:
        """Run the host steps whose inputs exist and hand the ready NPU segments to the dispatcher."""
        segs, deps = job.manifest.segments, job.model.deps
        while True:
            ready = [
                i for i in range(len(segs))
                if i not in job.done_segs and i not in job.queued and all(d in job.done_segs for d in deps[i])
            ]  # fmt: skip
            host = [i for i in ready if isinstance(segs[i], HostStep)]
            for i in host:
                now = self.tr.now()
                t0 = time.perf_counter()
                job.model.host.run(self.tr, segs[i], job.env)
                self.trace.span("host", job, now, now, info=f"{time.perf_counter() - t0:.6f} s on the host")
                job.done_segs.add(i)
            for i in ready:
                if i not in host:
                    self._submit_segment(job, i)
            if not host:
                break
        if len(job.done_segs) == len(segs):
            self._finish(job)
        elif not any(e.unit is not None and e.unit.job is job for e in self.engines) and not job.held:
            job.state = "ready"

    def _launch(self, e: Engine, op: Operator) -> None:
        """Start or resume segment `op.payload` of `op.job` on engine `e`."""
        job, s = op.job, op.payload
        e.unit = op
        sv = job.saved.pop(s, None)
        if sv is not None:
            t0 = self.tr.now()
            sv.preemption.restore_cycles = (
                self._run_aux(e, [("load", c, n, d) for c, n, d in sv.ranges]) if sv.ranges else 0
            )
            self._free_save_area(job, sv)
            self.trace.span("restore", job, t0, self.tr.now(), engine=e.index)
        job.state = "running"
        job.engines_used.add(e.index)
        if job.started is None:
            job.started = self.tr.now()
        pc = sv.resume_pc if sv is not None else job.manifest.segments[s].pc
        # the memory window: the job's program, data and save area, nothing of another model's
        e.tr.set_reg("DRAM_BASE", job.inst.region[0])
        e.tr.set_reg("DRAM_LIMIT", job.inst.region[1])
        e.tr.set_reg("PROGRAM_BASE", job.inst.program_base)
        e.tr.set_reg("RESUME_PC", pc)
        e.tr.set_resume_tokens(sv.tokens if sv is not None else [0, 0, 0])
        budget = 0 if job.timeout_cycles is None else max(1, job.timeout_cycles - job.used_cycles)
        e.tr.set_reg("TIMEOUT", budget if budget <= TIMEOUT_MAX else 0)
        e.tr.set_reg("IRQ", 1)
        e.run_start = self.tr.now()
        e.deadline = e.run_start + budget if budget > TIMEOUT_MAX else None
        e.tr.set_reg("CONTROL", int(RUN))
        first = sv is None and s == 0 and not job.done_segs
        self.trace.instant("start" if first else "resume", job, e.run_start, f"segment {s}", engine=e.index)

    def _request_pause(self, e: Engine, by: Job | None) -> None:
        e.pause_req = (self.tr.now(), by)
        e.tr.set_reg("CONTROL", int(Control.PAUSE | Control.IRQ_ENABLE))
        self.trace.instant("pause request", e.unit.job, e.pause_req[0], engine=e.index)

    def _account(self, e: Engine) -> None:
        """Add the run's counters to the job's and close its trace span."""
        job, s = e.unit.job, e.unit.payload
        run = {name: e.tr.counter(name) for name in COUNTERS}
        for name, v in run.items():
            job.counters[name] = job.counters.get(name, 0) + v
        job.used_cycles = job.counters["CYCLES"]
        job.segment_cycles[s] = job.segment_cycles.get(s, 0) + run["CYCLES"]
        now = self.tr.now()
        e.busy_cycles += now - e.run_start
        self.trace.span("run", job, e.run_start, now, f"segment {s}", engine=e.index)
        e.deadline = None

    def _timeout_text(self, job: Job) -> str:
        return f"job {job.id} ({job.model.name}) exceeded its timeout of {job.timeout_cycles} cycles"

    def _stopped(self, e: Engine, st: Status) -> None:
        op = e.unit
        job, s = op.job, op.payload
        now = self.tr.now()
        self._account(e)
        e.unit = None
        req, e.pause_req = e.pause_req, None
        e.tr.set_reg("IRQ", 1)
        if st == Status.DONE:
            self.dispatch.finished(op, e.index)
            job.done_segs.add(s)
            job.queued.discard(s)
            self._advance(job)
        elif st == Status.PAUSED:
            cp = e.tr.reg("CP_ID")
            resume_pc = e.tr.reg("RESUME_PC")
            tokens = e.tr.resume_tokens()
            self.trace.instant("paused", job, now, f"point {cp}, resume pc {resume_pc}", engine=e.index)
            point = job.model.points.get(cp)
            if point is None:
                self.dispatch.finished(op, e.index)
                self._fail(job, JobError(f"job {job.id} ({job.model.name}) paused at unknown point {cp}"))
                return
            area = self._save_area(job, point.live_bytes)
            addr = job.inst.save_addr if area is None else area[0]
            ranges = []
            for start, end in point.live_ranges:
                ranges.append((start, end - start, addr))
                addr += end - start
            t0 = self.tr.now()
            dump = self._run_aux(e, [("store", c, n, d) for c, n, d in ranges]) if ranges else 0
            self.trace.span("dump", job, t0, self.tr.now(), f"{point.live_bytes} bytes", engine=e.index)
            p = Preemption(cp, req[0] if req else now, now, point.live_bytes, dump,
                           by=req[1].id if req and req[1] else -1, segment=s, engine=e.index)  # fmt: skip
            job.preemptions.append(p)
            job.saved[s] = _Saved(resume_pc, tokens, ranges, area, p)
            if req is not None and req[1] is not None:  # preempted: it resumes on its own later
                self.dispatch.paused(op, e.index)
                if not any(x.unit is not None and x.unit.job is job for x in self.engines):
                    job.state = "ready"
            else:
                job.held.append((op, e.index))
                if not any(x.unit is not None and x.unit.job is job for x in self.engines):
                    job.state = "paused"
        else:
            self.dispatch.finished(op, e.index)
            code = ErrorCode(e.tr.reg("ERROR_CODE"))
            pc = e.tr.reg("ERROR_PC")
            if code == ErrorCode.TIMEOUT and job.timeout_cycles is not None:
                msg = self._timeout_text(job)
            else:
                msg = f"job {job.id} ({job.model.name}) ended in NPU error {code.name} at pc {pc}"
                if code == ErrorCode.PROTECTION:
                    lo, hi = job.inst.region
                    msg += (f": DRAM address 0x{e.tr.reg('FAULT_ADDR'):x} is outside the model's memory "
                            f"window [0x{lo:x}, 0x{hi:x})")  # fmt: skip
            self.soft_reset(e.index)
            self._fail(job, JobError(msg, code, pc))

    def _save_area(self, job: Job, nbytes: int) -> tuple[int, int] | None:
        """Where a dump of `nbytes` goes: the instance's save area, or (taken) a fresh DRAM range."""
        if nbytes == 0 or not job.inst.save_busy:
            job.inst.save_busy = job.inst.save_busy or nbytes > 0
            return None
        size = round_up(nbytes, PAGE)
        off = self.memory.alloc(size)
        if off is None:
            raise DriverError(f"no free DRAM for a second dump of {nbytes} bytes of job {job.id}")
        return (off, off + size)

    def _free_save_area(self, job: Job, sv: _Saved) -> None:
        if sv.area is not None:
            self.memory.release(*sv.area)
        elif sv.ranges:
            job.inst.save_busy = False

    def _finish(self, job: Job) -> None:
        outs = read_outputs(job.manifest, self.tr, job.env, job.int8)
        job.outputs = outs
        self._end(job, "done")

    def _fail(self, job: Job, err: Exception) -> None:
        job.error = err
        for e in self.engines:  # the job's other segments stop too
            if e.unit is not None and e.unit.job is job:
                self._stop_engine(e, err)
        for op, ei in job.held:
            self.dispatch.paused(op, ei)  # dropped when an engine takes it (the job is done)
        job.held = []
        for sv in job.saved.values():
            self._free_save_area(job, sv)
        job.saved = {}
        self._end(job, "failed")

    def _end(self, job: Job, state: str) -> None:
        if job.inst is not None and job.inst.job is job:
            job.inst.job = None  # first: nothing below may leave the instance taken
            self._admit_dirty = True  # a waiting job may take the instance
        try:
            job.finished = self.tr.now()
        finally:
            job.state = state
        job.env = {}  # the host tensors are not needed any more
        self.trace.instant(state, job, job.finished)
        if job.on_done:
            try:
                job.on_done(job)
            except Exception as e:  # the callback is part of the job: its error is the job's
                e.add_note(f"(raised by the on_done callback of job {job.id}, model {job.model.name})")
                job.state, job.error, job.outputs = "failed", e, None

    def _run_aux(self, e: Engine, moves: list[tuple[str, int, int, int]]) -> int:
        """Run a driver program of LOADs or STOREs (op, on-chip addr, bytes, DRAM addr) on engine `e`;
        its cycles."""
        b = ProgramBuilder(self.cfg.engine)
        for op, s, n, a in moves:
            for ins in copy_range(op, s, n, a):
                b.add(ins)
        unit, e.unit = e.unit, None
        try:
            st = self.run_raw(encode_program(b.build().instrs), max_cycles=10_000_000, engine=e.index)
        finally:
            e.unit = unit
        if st != Status.DONE:
            code = ErrorCode(e.tr.reg("ERROR_CODE"))
            self.soft_reset(e.index)
            raise DriverError(f"the driver's {moves[0][0]} program failed: {st.name} {code.name}")
        return e.tr.counter("CYCLES")

    def _recover_if_needed(self, when: str, e: Engine) -> None:
        st = e.tr.status()
        if st == Status.ERROR and e.unit is None:
            code = ErrorCode(e.tr.reg("ERROR_CODE"))
            self.soft_reset(e.index)
            self.trace.instant(f"recovered from {code.name} ({when})", None, self.tr.now(), engine=e.index)

    # -- figures ----------------------------------------------------------------------------------
    def utilization(self) -> list[int]:
        """Cycles each engine has run jobs' segments so far."""
        return [e.busy_cycles for e in self.engines]


def _topological(deps: list[list[int]]) -> list[int]:
    """Segment indices with every segment after the ones it reads from (index order where free)."""
    indeg = [len(set(d)) for d in deps]
    users: list[list[int]] = [[] for _ in deps]
    for i, ds in enumerate(deps):
        for d in set(ds):
            users[d].append(i)
    heap = [i for i, n in enumerate(indeg) if n == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        i = heapq.heappop(heap)
        out.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, u)
    if len(out) != len(deps):
        raise DriverError("the segments' dependencies form a cycle")
    return out
