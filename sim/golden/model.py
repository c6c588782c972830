"""The golden model: a bit-exact, cycle-approximate NPU behind the shared register map.

The model runs the decoupled pipeline of docs/isa.md as a discrete-event simulation at instruction
granularity: a dispatcher fetches instructions in order and puts each into its unit's queue (load,
matrix, vector, store); each unit starts its queue head once the tokens it waits for have arrived,
is busy for `npu.timing.duration` cycles and then pushes the tokens it signals. An instruction's data
effect is applied when it starts (a valid program orders every conflicting pair with tokens, so this
is indistinguishable from the hardware). Events are processed in time order, so the host can
interleave register accesses with simulated time (`advance`), e.g. to raise a pause at a given cycle.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from npu.config import NpuConfig, get_config
from npu.isa import INSTR_BYTES, ErrorCode, Instr, IsaError, Opcode, Unit, decode, dram_span, validate
from npu.registers import (
    BY_OFFSET,
    COUNTERS,
    ISA_VERSION,
    NPU_MAGIC,
    REG,
    RESUME_TOKEN_REGS,
    TOKEN_CHANNELS,
    Control,
    Status,
    pack_tokens,
    unpack_tokens,
)
from npu.sim.golden.kernels import OnChip, execute
from npu.sim.golden.narrow_dram import NarrowDram
from npu.timing import (
    FETCH_BURST,
    FETCH_REFILL,
    MICRO_OTHER,
    MICRO_RUN,
    dma_bursts,
    dma_bytes,
    duration,
    micro_duration,
)

UNITS = tuple(Unit)
_UNIT_INDEX = tuple(range(len(UNITS)))  # the units as plain ints (faster to index and shift by)
# the trace's names, looked up once (an enum member's `.name` is slow in the hot loop)
_UNIT_NAMES = {u: u.name.lower() for u in UNITS}
_OP_NAMES = {op: op.name.lower() for op in Opcode}
# opcodes the run loop tests, as module constants (an enum class attribute is slow to look up there)
_CANCEL_POINT, _FENCE, _SYNC = Opcode.CANCEL_POINT, Opcode.FENCE, Opcode.SYNC
_LOAD, _STORE, _END, _MATMUL = Opcode.LOAD, Opcode.STORE, Opcode.END, Opcode.MATMUL
_MARKERS = (_CANCEL_POINT, _FENCE)
_DIRTY = object()  # a unit's readiness not known (_Run.ready)
_BITS = [tuple(p for p in _UNIT_INDEX if w >> p & 1) for w in range(1 << len(UNITS))]  # a mask's units
_DMA_OPS = (_LOAD, _STORE)


def _outstanding(run: _Run) -> bool:
    """Whether any token channel holds a token."""
    return any(ch for channels in run.tokens for ch in channels)


#: each unit's busy-cycle counter
BUSY_COUNTERS = {
    Unit.LOAD: "BUSY_LOAD",
    Unit.MATRIX: "BUSY_MATRIX",
    Unit.VECTOR: "BUSY_VECTOR",
    Unit.STORE: "BUSY_STORE",
}

#: valid instruction words decoded and checked, per configuration, shared by every model instance (a
#: compiled model run on many inputs builds a model per run); bounded for long-running processes
_DECODED: dict[NpuConfig, dict[bytes, Instr]] = {}
_DECODED_MAX = 1 << 20
_DECODED_CONFIGS = 8
_DECODED_LOCK = threading.Lock()


def _decode_cache(cfg: NpuConfig) -> dict[bytes, Instr]:
    with _DECODED_LOCK:  # models are made from several threads (the driver's jobs)
        cache = _DECODED.pop(cfg, None)
        if cache is None or len(cache) > _DECODED_MAX:
            cache = {}
        _DECODED[cfg] = cache  # the most recent last: a design-space sweep's configurations drop out
        while len(_DECODED) > _DECODED_CONFIGS:
            del _DECODED[next(iter(_DECODED))]
        return cache


def _fetch_size(b: int) -> int:
    """Instructions in a narrow DRAM's fetch burst `b` of a run: the two that fill the fetcher's
    buffer take `FETCH_BURST`, each later one `FETCH_REFILL` (the fetcher asks as soon as that much
    room is free)."""
    return FETCH_BURST if b < 2 else FETCH_REFILL


def _fetch_slot(i: int) -> tuple[int, int]:
    """(burst, place in it) of a run's `i`-th fetched instruction (`_fetch_size`'s bursts)."""
    if i < 2 * FETCH_BURST:
        return divmod(i, FETCH_BURST)
    b, k = divmod(i - 2 * FETCH_BURST, FETCH_REFILL)
    return 2 + b, k


@dataclass
class TraceEvent:
    """One executed instruction (units) or one dispatcher stop, in absolute cycles."""

    unit: str
    pc: int
    op: str
    start: int
    end: int


class _Run:
    """State of one START..stop interval."""

    def __init__(self, cfg: NpuConfig, t0: int, base: int, pc: int, timeout: int, ring_size: int = 0):
        self.cfg = cfg
        self.t0 = t0
        self.base = base
        self.pc = pc
        self.timeout = timeout
        self.ring = ring_size != 0  # fetching from the command ring (base = RING_BASE)
        self.ring_size = ring_size
        # the first fetch pays the DRAM latency; the micro core's firmware its start and END
        self.next_dispatch = t0 + (MICRO_RUN if cfg.core == "micro" else cfg.dma_latency)
        self.queues: list[deque] = [deque() for _ in UNITS]
        self.starts: list[list[int]] = [[] for _ in UNITS]
        self.dispatched = [0] * len(UNITS)
        self.busy_until = [t0] * len(UNITS)
        self.last_end = t0
        # tokens[c][p]: the channel from producer p to consumer c (end times of the pushes), indexed
        # by plain ints: the hot loop reads it at every event
        self.tokens = [[deque() if p != c else None for p in range(len(UNITS))] for c in range(len(UNITS))]
        self.fetched: tuple[int, Instr | IsaError] | None = None
        self.points = 0  # cancellation points dispatched in this run
        self.passed = [0] * len(UNITS)  # cancellation-point markers each unit has passed
        # whether each unit has started anything (an instruction, a SYNC, a fence's marker) since
        # its last cancellation-point marker: while it has not, a pause may still stop at that point
        self.since = [False] * len(UNITS)
        self.point_at: dict[int, tuple[int, Instr]] = {}  # point ordinal -> (pc, its instruction)
        self.target: int | None = None  # ordinal of the point a pending pause stops at
        # each unit's `_unit_ready`, kept until its queue head, busy time, token channels or the
        # pause target change (`_DIRTY`: to be worked out again); the hot loop's main cost otherwise
        self.ready: list = []
        self.forget_ready()
        self.window = (0, 1 << 32)  # [DRAM_BASE, DRAM_LIMIT) as latched at START
        self.fetch_pc0 = pc  # a narrow DRAM (NarrowDram): where the fetcher's bursts started,
        self.bursts: list[int] = []  # and when each burst's words start

    def forget_ready(self) -> None:
        """Every unit's readiness is to be worked out again (the pause target, or every queue, moved)."""
        self.ready = [_DIRTY] * len(UNITS)

    def least_target(self) -> int:
        """The point a pause requested now stops at: the first point no unit has started anything
        after (docs/isa.md, `cancel_point`): a unit that has passed point k and started nothing
        since can still stop there; one that has started something after it cannot."""
        return max(1, max(p + s for p, s in zip(self.passed, self.since, strict=True)))


class NpuModel:
    """One NPU engine: DRAM, scratchpad, accumulators and registers, driven like the hardware."""

    def __init__(
        self, config: str | NpuConfig = "default", *, trace: bool = False, timing_only: bool = False
    ):
        """`timing_only`: skip the data computation (cycle counts do not depend on data), for cost
        models that only need the timing."""
        self.cfg = get_config(config).engine  # one engine (of a SoC preset: its engine)
        self._instr_beats = self.cfg.instr_beats
        self.timing_only = timing_only
        #: DRAM [lo, hi) whose bus beats the memory answers with an error (a LOAD reads zeros there,
        #: a STORE's beats there are dropped, and the run ends in BUS); None: every access is fine
        self.bus_fault: tuple[int, int] | None = None
        self.dram = np.zeros(self.cfg.dram_bytes, np.uint8)
        #: the DRAM port shared with other engines (`npu.sim.golden.system.DramPort`); None: alone
        self.port = None
        #: a DRAM narrower than the bus, which the fetcher and the DMA units take in turn
        self.narrow = NarrowDram(self.cfg) if self.cfg.dram_word_bytes else None
        #: the micro core: one processor fetches, checks and runs every instruction in turn (its
        #: firmware's costs: npu.timing.MICRO_COSTS); the cycle it is free again
        self.serial = self.cfg.core == "micro"
        self.cpu_free = 0
        #: `a16_second_port`: how to move the end of the matrix unit's latest int16 MATMUL (a no-op
        #: once it has ended or another instruction followed) and the load's and the vector unit's
        #: writes into the activations' banks (their ends, words a cycle), which meet on the banks'
        #: port B (`_port_b`)
        self._b_matmul: Callable[[int, int], bool] | None = None
        self._b_writes: dict[Unit, tuple[int, float]] = {}
        self.chip = OnChip(self.cfg)
        self.now = 0
        self.trace: list[TraceEvent] | None = [] if trace else None
        self._decode_cache = _decode_cache(self.cfg)
        #: a timing-only model's program given as instructions (`load_instructions`): DRAM address ->
        #: the instruction, or the IsaError its checks raise
        self._predecoded: dict[int, Instr | IsaError] | None = None
        self._hi_latch = 0
        self.soft_reset()

    # -- memories --------------------------------------------------------------------------------
    def write_dram(self, addr: int, data: bytes | np.ndarray) -> None:
        buf = np.frombuffer(
            bytes(data) if not isinstance(data, np.ndarray) else np.ascontiguousarray(data).tobytes(),
            np.uint8,
        )
        if addr < 0 or addr + len(buf) > len(self.dram):
            raise ValueError(f"DRAM write 0x{addr:x}+{len(buf)} is outside DRAM (0x{len(self.dram):x} bytes)")
        self.dram[addr : addr + len(buf)] = buf

    def read_dram(self, addr: int, n: int) -> bytes:
        if addr < 0 or addr + n > len(self.dram):
            raise ValueError(f"DRAM read 0x{addr:x}+{n} is outside DRAM (0x{len(self.dram):x} bytes)")
        return self.dram[addr : addr + n].tobytes()

    # -- registers -------------------------------------------------------------------------------
    def soft_reset(self) -> None:
        self.status = Status.IDLE
        self.control = Control(0)
        self.irq_pending = False
        self.program_base = 0
        self.resume_pc = 0
        self.resume_tokens = [0, 0, 0]  # RESUME_TOKENS0..2
        self.cp_id = 0
        self.error_code = ErrorCode.NONE
        self.error_pc = 0
        self.timeout = 0
        self.ring_base = 0
        self.ring_size = 0
        self.ring_tail = 0
        self.ring_head = 0
        self.fence_count = 0
        self.dram_base = 0  # the memory window (docs/isa.md, PROTECTION)
        self.dram_limit = 0
        self.fault_addr = 0
        self._fence_passed = [0] * len(UNITS)  # fence markers each unit has passed (since reset)
        self._fence_time = 0  # when the last fence completed
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._pause_cycle: int | None = None
        self._run: _Run | None = None

    def read_reg(self, off: int) -> int:
        r = BY_OFFSET.get(off)
        if r is None:
            lo = BY_OFFSET.get(off - 4)
            # HI half of a 64-bit counter: the value latched by the last LO read
            return self._hi_latch if lo is not None and lo.wide else 0
        name = r.name
        if r.wide:
            v = self._counter(name)
            self._hi_latch = (v >> 32) & 0xFFFFFFFF
            return v & 0xFFFFFFFF
        return {
            "ID": NPU_MAGIC,
            "VERSION": ISA_VERSION,
            "CONFIG_ID": self.cfg.config_id,
            "CONTROL": int(self.control & ~Control.START & ~Control.SOFT_RESET)
            | (int(Control.PAUSE) if self._pause_cycle is not None else 0),
            "STATUS": int(Status.WAITING if self.waiting else self.status),
            "IRQ": int(self.irq_pending),
            "PROGRAM_BASE": self.program_base,
            "RESUME_PC": self.resume_pc,
            **dict(zip(RESUME_TOKEN_REGS, self.resume_tokens, strict=True)),
            "CP_ID": self.cp_id,
            "ERROR_CODE": int(self.error_code),
            "ERROR_PC": self.error_pc,
            "TIMEOUT": self.timeout,
            "RING_BASE": self.ring_base,
            "RING_SIZE": self.ring_size,
            "RING_TAIL": self.ring_tail,
            "RING_HEAD": self._run.pc if self._run is not None else self.ring_head,
            "FENCE_COUNT": self.fence_count,
            "DRAM_BASE": self.dram_base,
            "DRAM_LIMIT": self.dram_limit,
            "FAULT_ADDR": self.fault_addr,
        }[name]

    def read_counter(self, name: str) -> int:
        lo = self.read_reg(REG[name].offset)
        return lo | (self.read_reg(REG[name].offset + 4) << 32)

    def _counter(self, name: str) -> int:
        if name == "CYCLES" and self._run is not None:
            return self.now - self._run.t0
        return self.counters[name]

    def write_reg(self, off: int, value: int) -> None:
        r = BY_OFFSET.get(off)
        if r is None or r.access == "ro":
            return  # writes to read-only or unmapped registers are ignored, like the hardware
        value &= 0xFFFFFFFF
        if r.name == "CONTROL":
            ctl = Control(value & 0xF)
            if ctl & Control.SOFT_RESET:
                self.soft_reset()
                return
            self.control = ctl & Control.IRQ_ENABLE
            if ctl & Control.PAUSE:
                if self._pause_cycle is None:
                    self._pause_cycle = self.now
                    if self._run is not None:
                        self._run.target = self._run.least_target()
                        self._run.forget_ready()
            else:
                self._pause_cycle = None
                if self._run is not None:
                    self._run.target = None
                    self._run.forget_ready()
            if ctl & Control.START and self.status != Status.RUNNING:
                self._start()
        elif r.name == "IRQ":
            if value & 1:
                self.irq_pending = False
        elif r.name == "PROGRAM_BASE":
            self.program_base = value
        elif r.name == "RESUME_PC":
            self.resume_pc = value
        elif r.name in RESUME_TOKEN_REGS:
            self.resume_tokens[RESUME_TOKEN_REGS.index(r.name)] = value
        elif r.name == "TIMEOUT":
            self.timeout = value
        elif r.name == "RING_BASE":
            self.ring_base = value
        elif r.name == "RING_SIZE":
            self.ring_size = value
        elif r.name == "DRAM_BASE":
            self.dram_base = value
        elif r.name == "DRAM_LIMIT":
            self.dram_limit = value
        elif r.name == "RING_TAIL":
            run = self._run
            if run is not None and run.ring and run.pc == self.ring_tail and value != self.ring_tail:
                # the fetcher was starved: it asks for the new instructions now
                run.next_dispatch = max(run.next_dispatch, self.now + self.cfg.dma_latency)
                if self.narrow is not None:
                    self._fetch_from(run, self.now)
            self.ring_tail = value

    @property
    def starved(self) -> bool:
        """Running from the ring with every appended instruction dispatched."""
        run = self._run
        return run is not None and run.ring and run.pc == self.ring_tail

    @property
    def waiting(self) -> bool:
        """STATUS reads WAITING: the ring is empty and every instruction taken from it is done."""
        run = self._run
        return self.starved and not any(run.queues) and self.now >= max(run.busy_until)

    @property
    def irq(self) -> bool:
        """The interrupt line."""
        return self.irq_pending and bool(self.control & Control.IRQ_ENABLE)

    # -- running ---------------------------------------------------------------------------------
    def _start(self) -> None:
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.error_code = ErrorCode.NONE
        self.error_pc = 0
        self.fault_addr = 0
        self.status = Status.RUNNING
        if self._pause_cycle is not None:
            self._pause_cycle = self.now
        ring = self.ring_size
        base = self.ring_base if ring else self.program_base
        self._run = _Run(self.cfg, self.now, base, self.resume_pc, self.timeout, ring)
        # the channels start with the counts of RESUME_TOKENS (a resume: those at the pause)
        for (p, c), n in unpack_tokens(self.resume_tokens).items():
            self._run.tokens[c][p].extend([self.now] * n)
        self.resume_tokens = [0, 0, 0]
        self._run.window = (self.dram_base, self.dram_limit or 1 << 32)
        if self.narrow is not None:
            self._fetch_from(self._run, self.now)
        # markers dropped by an error or a pause are fetched again: count from the completed fences
        self._fence_passed = [self.fence_count] * len(UNITS)
        if self._pause_cycle is not None:
            self._run.target = 1

    def advance(self, cycles: int) -> Status:
        """Let `cycles` cycles pass (the host's clock moves with the device's)."""
        self._simulate(self.now + cycles)
        return self.status

    def advance_until_passed(self, points: int) -> Status:
        """Simulate until some unit has passed `points` cancellation points of this run (or the core
        stopped): a pause request then targets point `points` (`_Run.least_target`: the unit
        that has just passed it has started nothing after it)."""
        self._simulate(None, stop_early=True, stop_when=lambda run: max(run.passed) >= points)
        return self.status

    def advance_until_target(self, target: int) -> Status:
        """Simulate until a pause requested then would target point `target` (or the core stopped):
        each event moves a unit's least point by at most one, so the first moment it reaches
        `target` is that moment."""
        self._simulate(None, stop_early=True, stop_when=lambda run: run.least_target() >= target)
        return self.status

    def run(self, max_cycles: int | None = None, *, until_fence: bool = False) -> Status:
        """Simulate until the core stops (DONE, PAUSED or ERROR), or `max_cycles` pass, or (with
        `until_fence`) a FENCE completes. Running from an empty ring, the core waits for the host:
        the simulation ends there (after `max_cycles` if given)."""
        until = None if max_cycles is None else self.now + max_cycles
        f0 = self.fence_count
        stop_when = (lambda _run: self.fence_count != f0) if until_fence else None
        self._simulate(until, stop_early=True, stop_when=stop_when)
        if until_fence and self.fence_count != f0:
            self.now = max(self.now, self._fence_time)  # the count is visible after the pass cycle
        return self.status

    def _stop(self, status: Status, t: int, *, code: ErrorCode = ErrorCode.NONE, pc: int = 0) -> None:
        run = self._run
        assert run is not None
        self.counters["CYCLES"] = t - run.t0
        self.status = status
        if status == Status.ERROR:
            self.error_code = code
            self.error_pc = pc
        self.irq_pending = True
        self._pause_cycle = None
        if self.narrow is not None:  # the fetcher's prefetches past the stop are not waited for
            self.narrow.stop(t)
        self.cpu_free = min(self.cpu_free, t)
        # the count of the next instruction (a pause drops what followed the point: resume after it)
        self.ring_head = self.resume_pc if status == Status.PAUSED else run.pc
        self._run = None
        self.now = max(self.now, t)
        if self.trace is not None:
            self.trace.append(TraceEvent("control", pc, status.name.lower(), t, t))

    def _fetch(self, run: _Run) -> Instr | IsaError:
        if run.fetched is not None and run.fetched[0] == run.pc:
            return run.fetched[1]
        res: Instr | IsaError
        if run.ring:
            n = run.ring_size // INSTR_BYTES
            addr = run.base + (run.pc % max(n, 1)) * INSTR_BYTES
            bad = run.ring_size < INSTR_BYTES or run.ring_size & (run.ring_size - 1) or (
                run.base + run.ring_size > self.cfg.dram_bytes)  # fmt: skip
        else:
            addr = run.base + run.pc * INSTR_BYTES
            bad = addr + INSTR_BYTES > self.cfg.dram_bytes
        lo, hi = run.window
        if run.base % INSTR_BYTES or bad:
            what = (
                "the ring is not a power of two >= 32 bytes inside DRAM, or RING_BASE"
                if run.ring
                else f"instruction fetch at 0x{addr:x} is outside DRAM, or PROGRAM_BASE"
            )
            res = IsaError(ErrorCode.DRAM_RANGE, f"{what} is not 32-byte aligned")
        elif run.ring and (run.base < lo or run.base + run.ring_size > hi):
            res = self._protection(run.base, f"the ring at 0x{run.base:x}+{run.ring_size}", lo, hi)
        elif addr < lo or addr + INSTR_BYTES > hi:
            res = self._protection(addr, f"instruction fetch at 0x{addr:x}", lo, hi)
        elif self._beats_fault(addr, INSTR_BYTES):
            res = IsaError(ErrorCode.BUS, f"the memory answered the fetch at 0x{addr:x} with an error")
        else:
            pre = self._predecoded
            if pre is not None and addr in pre:
                res = pre[addr]
            else:
                res = self.decoded(self.dram[addr : addr + INSTR_BYTES].tobytes())
            if isinstance(res, Instr) and res.op in _DMA_OPS:
                start, end = dram_span(res)
                if start < end and (start < lo or end > hi):
                    what = "LOAD reads" if res.op == _LOAD else "STORE writes"
                    res = self._protection(start, f"{what} DRAM [0x{start:x}, 0x{end:x})", lo, hi)
        run.fetched = (run.pc, res)
        return res

    def decoded(self, raw: bytes) -> Instr | IsaError:
        """An instruction word decoded and checked as the dispatch checks it (`validate`), or the
        IsaError the checks raise; valid words are cached."""
        res = self._decode_cache.get(raw)
        if res is None:
            try:
                res = decode(raw)
                validate(res, self.cfg)
                self._decode_cache[raw] = res
            except IsaError as e:
                return e
        return res

    @staticmethod
    def _protection(addr: int, what: str, lo: int, hi: int) -> IsaError:
        e = IsaError(ErrorCode.PROTECTION, f"{what} is outside the memory window [0x{lo:x}, 0x{hi:x})")
        e.fault_addr = addr  # type: ignore[attr-defined]
        return e

    def _unit_ready(self, run: _Run, u: int) -> int | None:
        q = run.queues[u]
        if not q:
            return None
        if run.target is not None and run.passed[u] >= run.target:
            return None  # it passed the target point and started nothing since: it stays there
        head = q[0]
        ins = head[1]
        t = head[2] + 1
        if run.busy_until[u] > t:
            t = run.busy_until[u]
        if self.cpu_free > t:
            t = self.cpu_free
        op = ins.op
        if op is _CANCEL_POINT:
            # a marker: passed at once, unless a pending pause stops at it (the unit parks)
            return None if run.target == head[3] else t
        if op is _FENCE:  # a marker: passed once the unit is free
            return t
        w = ins.wait
        if w:
            channels = run.tokens[u]
            for p in _BITS[w]:
                ch = channels[p]
                if not ch:
                    return None
                if ch[0] > t:
                    t = ch[0]
        return t

    def _parked_ready(self, run: _Run) -> int | None:
        """Time at which every unit has parked at the target point (the pause completes): its marker
        at the queue head, or passed with nothing started since; not before the request."""
        if run.target is None:
            return None
        t = self._pause_cycle or 0
        for u in UNITS:
            if run.passed[u] >= run.target:
                t = max(t, run.busy_until[u])
                continue
            q = run.queues[u]
            if not q or q[0][1].op != _CANCEL_POINT or q[0][3] != run.target:
                return None
            t = max(t, q[0][2] + 1, run.busy_until[u])
        return t

    def _fetch_from(self, run: _Run, t: int) -> None:
        """A narrow DRAM: the fetcher starts at `run.pc` and asks for two bursts (its buffer)."""
        run.fetch_pc0 = run.pc
        run.bursts = [self.narrow.fetch(t, FETCH_BURST), self.narrow.fetch(t, FETCH_BURST)]

    def _instr_ready(self, run: _Run) -> int:
        """A narrow DRAM: the cycle instruction `run.pc`'s words have arrived."""
        b, k = _fetch_slot(run.pc - run.fetch_pc0)
        while len(run.bursts) <= b:  # not asked for yet (not reached in order)
            run.bursts.append(self.narrow.fetch(self.now, _fetch_size(len(run.bursts))))
        return run.bursts[b] + (k + 1) * self.narrow.instr_cycles

    def _dispatch_ready(self, run: _Run) -> int | None:
        if run.ring and run.pc == self.ring_tail:
            return None  # the ring is empty: wait for the host's doorbell
        base = run.next_dispatch
        if self.narrow is not None:  # its words have arrived
            base = max(base, self._instr_ready(run))
        if self.serial:
            base = max(base, self.cpu_free)
        ins = self._fetch(run)
        if isinstance(ins, IsaError):
            return base
        u = ins.unit
        if u is not None:
            if len(run.queues[u]) >= self.cfg.queue_depth:
                return None
            n = run.dispatched[u] - self.cfg.queue_depth
            return max(base, run.starts[u][n]) if n >= 0 else base
        if ins.op in _MARKERS:  # a marker into every queue: a slot in each
            t = base
            for q in UNITS:
                if len(run.queues[q]) >= self.cfg.queue_depth:
                    return None
                n = run.dispatched[q] - self.cfg.queue_depth
                if n >= 0:
                    t = max(t, run.starts[q][n])
            return t
        if any(run.queues):  # END and BARRIER wait for every queue to drain
            return None
        return max(base, run.last_end)

    def next_event(self) -> tuple[int, Callable[[], None]] | None:
        """The engine's next event: its cycle and the action that carries it out (None: stopped).
        Running the actions in time order is the simulation; `NpuSystem` interleaves several
        engines' events this way."""
        run = self._run
        if run is None:
            return None
        best_t, best_u = None, None
        if self.serial:  # the firmware's clock (cpu_free) moves every unit's readiness
            run.forget_ready()
        cache = run.ready
        for u in _UNIT_INDEX:
            t = cache[u]
            if t is _DIRTY:
                t = cache[u] = self._unit_ready(run, u)
            if t is not None and (best_t is None or t < best_t):
                best_t, best_u = t, u
        if best_u is not None:
            best_u = UNITS[best_u]
        td = self._dispatch_ready(run)
        # the micro core's firmware dispatches while it can before it runs a queue head
        if td is not None and (best_t is None or td < best_t or (self.serial and td == best_t)):
            best_t, best_u = td, None
        tp = self._parked_ready(run)
        if tp is not None and (best_t is None or tp < best_t):
            best_t, best_u = tp, "park"
        limit = run.t0 + run.timeout if run.timeout else None
        if best_t is None and self.starved and not any(run.queues):
            # waiting for the host to append to the ring: only the timeout can happen
            if limit is None:
                return None
            t_lim = max(limit, self.now)
            return t_lim, lambda: self._error_after_drain(run, t_lim, ErrorCode.TIMEOUT, run.pc)
        if best_t is None:  # nothing can happen any more: a deadlock, or the timeout first
            t_dead = max(run.last_end, run.next_dispatch)
            code = ErrorCode.DEADLOCK
            if limit is not None and t_dead > limit:
                t_dead, code = limit, ErrorCode.TIMEOUT
            return t_dead, lambda: self._error_after_drain(run, t_dead, code, run.pc)
        if limit is not None and best_t > limit:
            return limit, lambda: self._error_after_drain(run, limit, ErrorCode.TIMEOUT, run.pc)
        if best_u is None:
            return best_t, lambda: self._dispatch(run, best_t)
        if best_u == "park":
            return best_t, lambda: self._pause(run, best_t)
        return best_t, lambda: self._execute(run, best_u, best_t)

    def _simulate(self, until: int | None, stop_early: bool = False, stop_when=None) -> None:
        """Simulate up to cycle `until`; the clock ends at `until` unless `stop_early` and the core
        stopped before it (then it ends at the stop). `stop_when(run)`, checked before each event,
        ends the simulation early at the last event's time."""
        while self._run is not None:
            if stop_when is not None and stop_when(self._run):
                return
            ev = self.next_event()
            if ev is None:  # waiting for the host (an empty ring), from when the units are done
                self.now = max(self.now, max(self._run.busy_until))
                break
            t, action = ev
            if until is not None and t > until:
                break
            action()
            self.now = max(self.now, t)
        if until is not None and not (stop_early and self._run is None):
            self.now = max(self.now, until)

    def _error_after_drain(self, run: _Run, t: int, code: ErrorCode, pc: int) -> None:
        """Discard queued instructions, let in-flight ones finish, then report the error."""
        for q in run.queues:
            q.clear()
        self._stop(Status.ERROR, max(t, max(run.busy_until)), code=code, pc=pc)

    def _dispatch(self, run: _Run, t: int) -> None:
        ins = self._fetch(run)
        self.counters["STALL_DISPATCH"] += t - run.next_dispatch
        if isinstance(ins, IsaError):
            self.fault_addr = getattr(ins, "fault_addr", 0)
            self._error_after_drain(run, t, ins.code, run.pc)
            return
        self.counters["INSTRET"] += 1
        pc = run.pc
        u = ins.unit
        if u is not None:
            run.queues[u].append((pc, ins, t))
            run.dispatched[u] += 1
            run.ready[u] = _DIRTY
        elif ins.op == _CANCEL_POINT:
            run.points += 1
            run.point_at[run.points] = (pc, ins)
            for q in UNITS:
                run.queues[q].append((pc, ins, t, run.points))
                run.dispatched[q] += 1
            run.forget_ready()
            if self.trace is not None:
                self.trace.append(TraceEvent("dispatch", pc, "cancel_point", t, t))
        elif ins.op == _FENCE:  # a marker into every queue; later instructions go on
            for q in UNITS:
                run.queues[q].append((pc, ins, t, None))
                run.dispatched[q] += 1
            run.forget_ready()
        elif ins.op == _END:
            if _outstanding(run):
                self._error_after_drain(run, t, ErrorCode.TOKEN, pc)
                return
            self.resume_pc = pc
            self.resume_tokens = [0, 0, 0]
            self._stop(Status.DONE, t, pc=pc)
            return
        if self.serial:  # the firmware's fetch, checks and queueing of the instruction (a control
            # instruction's whole cost: a cancellation point's or fence's markers run in each queue)
            self.cpu_free = max(t, self.cpu_free) + (MICRO_OTHER if u is not None else micro_duration(ins))
        run.pc = (run.pc + 1) & 0xFFFFFFFF
        if self.narrow is not None and _fetch_slot(run.pc - run.fetch_pc0)[1] == 0:
            # a burst's slots are free: the fetcher asks for the next but one
            run.bursts.append(self.narrow.fetch(t, _fetch_size(len(run.bursts))))
        run.next_dispatch = t + self._instr_beats

    def _pause(self, run: _Run, t: int) -> None:
        """Every unit is parked at the target point: stop there (the queues behind it are dropped)."""
        pc, ins = run.point_at[run.target]
        for q in run.queues:
            q.clear()
        self.resume_pc = pc + 1
        # tokens pushed before the point for instructions after it: kept for the resume
        self.resume_tokens = pack_tokens({(p, c): len(run.tokens[c][p]) for p, c in TOKEN_CHANNELS})
        self.cp_id = ins.id
        self._stop(Status.PAUSED, t, pc=pc)

    def _execute(self, run: _Run, u: Unit, t: int) -> None:
        entry = run.queues[u].popleft()
        pc, ins = entry[0], entry[1]
        run.ready[u] = _DIRTY
        if ins.op in _MARKERS:  # passing a marker takes one cycle
            run.starts[u].append(t)
            run.busy_until[u] = t + 1
            if ins.op == _CANCEL_POINT:
                run.passed[u] += 1
                run.since[u] = False
            else:
                run.since[u] = True
                self._fence_passed[u] += 1
                # the fence completes when the last unit passes it: every earlier instruction is done
                if min(self._fence_passed) > self.fence_count:
                    self.fence_count = (self.fence_count + 1) & 0xFFFFFFFF
                    self.irq_pending = True
                    self._fence_time = t + 1
                    if self.trace is not None:
                        self.trace.append(TraceEvent("control", pc, "fence", t + 1, t + 1))
            if self.trace is not None:
                op = "pass_point" if ins.op == _CANCEL_POINT else "pass_fence"
                self.trace.append(TraceEvent(_UNIT_NAMES[u], pc, op, t, t + 1))
            return
        run.since[u] = True
        w = ins.wait
        if w:
            channels = run.tokens[u]
            for p in _BITS[w]:
                channels[p].popleft()
        op = ins.op
        faulted = self._faults(ins)
        if faulted:
            lo, hi = self.bus_fault
            kept = self.dram[lo:hi].copy()
            if op == _LOAD:
                self.dram[lo:hi] = 0  # the faulting beats bring zeros
        if op != _SYNC and not self.timing_only:
            execute(self.chip, self.dram, ins)
        if faulted:
            self.dram[lo:hi] = kept  # the faulting beats of a STORE are dropped
        d = duration(ins, self.cfg)
        if self.serial:  # the rest of the firmware's cost, after the dispatch's MICRO_OTHER
            d = max(1, d - MICRO_OTHER)
            self.cpu_free = t + d
        narrow = self.narrow is not None and op in _DMA_OPS
        if narrow:  # the memory serves one transfer at a time
            bursts = dma_bursts(ins.dram, ins.rows, ins.cols, ins.dram_stride, self.cfg.bus_bytes)
            d += self.narrow.transfer(t, d, bursts, op == _STORE)
        xfer = None
        if self.port is not None and op in _DMA_OPS:
            xfer = self.port.transfer(self, ins, t)  # other engines' bursts on the shared channel
            d += xfer.delay if xfer is not None else 0
        end = t + d
        run.starts[u].append(t)
        run.busy_until[u] = end
        run.last_end = max(run.last_end, end)
        self.counters[BUSY_COUNTERS[u]] += d
        if op in _DMA_OPS:
            rd, wr = dma_bytes(ins)
            self.counters["DMA_RD_BYTES"] += rd
            self.counters["DMA_WR_BYTES"] += wr
        ev = None
        if self.trace is not None:
            ev = TraceEvent(_UNIT_NAMES[u], pc, _OP_NAMES[op], t, end)
            self.trace.append(ev)
        if faulted:
            self._error_after_drain(run, end, ErrorCode.BUS, pc)
            return
        sig = ins.signal
        signalled = [UNITS[c] for c in _BITS[sig]] if sig else []
        for c in signalled:
            ch = run.tokens[c][u]
            if len(ch) >= self.cfg.token_depth:
                self._error_after_drain(run, end, ErrorCode.TOKEN, pc)
                return
            ch.append(end)
            run.ready[c] = _DIRTY
        if xfer is not None or narrow or self.cfg.a16_second_port:
            ordinal = len(run.starts[u])  # the unit's instructions so far: this one is the latest
            retime = lambda extra, now: self._retime(run, u, ordinal, extra, now, signalled, ev)  # noqa: E731
            if xfer is not None:
                xfer.retime = retime
            elif narrow:
                self.narrow.retime_with(retime)
            if self.cfg.a16_second_port:
                self._port_b(run, ins, t, retime)

    def _port_b(self, run: _Run, ins: Instr, t: int, retime: Callable[[int, int], bool]) -> None:
        """`a16_second_port`: an int16 MATMUL reads each cluster's second A word of a step on the
        banks' port B, after the vector unit's and the load unit's writes there: one into the
        activations' half (the lower) while it runs holds one of its steps a cycle a word."""
        if ins.op == _MATMUL:
            if not ins.a_i16:
                return
            end = run.busy_until[Unit.MATRIX]
            writes = [(w_end, rate) for w_end, rate in self._b_writes.values() if w_end > t]
            extra = sum(round((min(w_end, end) - t) * rate) for w_end, rate in writes)
            if extra:
                retime(extra, t)
            self._b_matmul = retime
            return
        unit = ins.unit
        if ins.op != _LOAD and unit != Unit.VECTOR:
            return
        f = ins.fields
        dst = f.get("spad") if ins.op == _LOAD else f.get("dst")
        if dst is None or dst >= self.cfg.spad_bytes // 2 or not f.get("rows") or not f.get("cols"):
            return
        end = run.busy_until[unit]
        wide = 2 if f.get("dst_i16") else 1
        rate = f["rows"] * -(-f["cols"] * wide // self.cfg.lanes) / max(1, end - t)
        self._b_writes[unit] = (end, rate)
        m_end = run.busy_until[Unit.MATRIX]  # the latest MATMUL's, if it is the unit's latest
        if self._b_matmul is not None and m_end > t:
            extra = round((min(end, m_end) - t) * rate)
            if extra:
                self._b_matmul(extra, t)

    def _retime(
        self,
        run: _Run,
        u: Unit,
        ordinal: int,
        extra: int,
        now: int,
        signalled: list[Unit],
        ev: TraceEvent | None,
    ) -> bool:
        """Move the end of unit `u`'s `ordinal`-th instruction by `extra` cycles: another engine's
        transfer, starting at `now`, slows its transfer down. Only while it is the unit's latest
        instruction and has not ended (nor the run); False when nothing moved."""
        if run is not self._run or len(run.starts[u]) != ordinal or run.busy_until[u] <= now:
            return False
        cur = run.busy_until[u]
        new = cur + extra
        run.busy_until[u] = new
        run.last_end = max(run.last_end, new)
        self.counters[BUSY_COUNTERS[u]] += extra
        run.ready[u] = _DIRTY
        for c in signalled:
            ch = run.tokens[c][u]
            if ch and ch[-1] == cur:
                ch[-1] = new
            run.ready[c] = _DIRTY
        if ev is not None:
            ev.end = new
        return True

    def _faults(self, ins: Instr) -> bool:
        """A LOAD or STORE with a bus beat in the faulting range."""
        if self.bus_fault is None or ins.op not in _DMA_OPS:
            return False
        return any(
            self._beats_fault(ins.dram + r * ins.dram_stride, ins.cols)
            for r in range(ins.rows if ins.cols else 0)
        )

    def _beats_fault(self, addr: int, n: int) -> bool:
        if self.bus_fault is None:
            return False
        lo, hi = self.bus_fault
        W = self.cfg.bus_bytes
        return addr // W * W < hi and -(-(addr + n) // W) * W > lo

    # -- convenience for tests, tools and the driver ------------------------------------------------
    def load_instructions(self, instrs: list[Instr], base: int) -> None:
        """A timing-only model's program as instructions (the compiler's cost model): fetched
        without encoding them into DRAM and decoding them back (about half of such a run), checked
        as a fetch checks them. DRAM keeps what it held (a timing-only model computes no data)."""
        if not self.timing_only:
            raise ValueError("only a timing-only model takes a program as instructions")
        pre: dict[int, Instr | IsaError] = {}
        for i, ins in enumerate(instrs):
            try:
                validate(ins, self.cfg)
                pre[base + i * INSTR_BYTES] = ins
            except IsaError as e:
                pre[base + i * INSTR_BYTES] = e
        self._predecoded = pre
        self.program_base = base
        self.resume_pc = 0
        self.resume_tokens = [0, 0, 0]  # a new program starts with empty channels

    def load_program(self, program: bytes, base: int) -> None:
        self._predecoded = None
        self.write_dram(base, program)
        self.program_base = base
        self.resume_pc = 0
        self.resume_tokens = [0, 0, 0]  # a new program starts with empty channels

    def start(self, pc: int | None = None, pause: bool = False) -> None:
        if pc is not None:
            self.resume_pc = pc
        self.write_reg(REG["CONTROL"].offset, int(Control.START | (Control.PAUSE if pause else 0)))

    def request_pause(self) -> None:
        self.write_reg(REG["CONTROL"].offset, int(Control.PAUSE))

    def counter_values(self) -> dict[str, int]:
        return {name: self._counter(name) for name in COUNTERS}
