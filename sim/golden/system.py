"""The golden model of the SoC: `config.engines` engines (`NpuModel`s of `config.engine`) over one DRAM
and one AXI port, behind the SoC's register map (npu/registers.py).

Timing rule of the shared port (docs/isa.md, "Several engines"): AXI reads and writes are separate
channels, each moving one bus word per cycle for all engines together. The interconnect grants bursts
round-robin, one per engine per turn, so engines whose transfers overlap share a channel in
proportion to their burst lengths: a transfer is slowed by the other engines' bursts served between
its own. A transfer that starts while others run first waits for the bursts the memory has already
accepted (its read queue; one write burst). The model follows each channel's transfers as a fluid
(rounds of one burst per engine) and, when a transfer starts, projects when every running transfer
will finish; the delay against finishing alone adds to the instruction's duration, and a transfer
that a later one slows down has its end moved (`NpuModel._retime`). Events are processed in time
order, so nothing that depends on an end has happened yet when it moves. One engine alone never waits
(its load and store units each move one transfer at a time), so the single-engine timing is
unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from npu.config import NpuConfig, get_config
from npu.isa import Instr, Opcode
from npu.registers import ISA_VERSION, SOC_MAGIC, SOC_REG, Status, window_of
from npu.sim.golden.model import NpuModel
from npu.timing import WRITE_BURST_CYCLES, dma_beats, dma_bursts


@dataclass(eq=False)
class Transfer:
    """One LOAD's or STORE's data on a channel."""

    owner: object  # the engine
    bursts: int
    occupancy: int  # channel cycles alone: beats plus per-burst overhead
    join: float  # when its bursts start to be served (after the bursts already accepted)
    alone_done: int  # when it would be done alone
    left: float = 0.0  # bursts not yet served
    delay: int = 0  # cycles added to the instruction so far
    #: moves the instruction's end: retime(extra cycles, now) -> False when it is already over
    retime: Callable[[int, int], bool] | None = None

    @property
    def per_burst(self) -> float:
        return self.occupancy / self.bursts


class Channel:
    """The read or the write channel of the shared port (one bus word per cycle).

    `accepted`: bursts the memory holds at once (the one being served included); a starting transfer
    waits for the ones other engines have queued. `overhead`: channel cycles per burst besides its
    beats (a write burst's address and response handshakes). `lead`: cycles from an instruction's
    start to its first burst request."""

    def __init__(self, accepted: int, overhead: int, lead: int):
        self.accepted, self.overhead, self.lead = accepted, overhead, lead
        self.now = 0.0
        self.xfers: list[Transfer] = []
        self.waited = 0  # cycles transfers were slowed down in total

    @staticmethod
    def _run(xfers: list[Transfer], t: float, until: float | None) -> tuple[dict, float]:
        """Serve `xfers` (changed in place; finished ones removed) from `t` to `until` (None: until
        all are done): the transfers that have joined share the channel in rounds of one burst each.
        Returns the finish time of each transfer that finished, and the time reached."""
        done: dict[int, float] = {}
        while xfers and (until is None or t < until):
            sharing = [x for x in xfers if x.join <= t]
            nxt = min((x.join for x in xfers if x.join > t), default=None)
            if not sharing:
                t = nxt if until is None else min(nxt, until)
                continue
            rnd = sum(x.per_burst for x in sharing)  # cycles per round
            least = min(x.left for x in sharing)
            t_next = t + least * rnd  # the first of them finishes
            finishing = True
            if nxt is not None and nxt < t_next:
                t_next, finishing = nxt, False
            if until is not None and until < t_next:
                t_next, finishing = until, False
            rounds = least if finishing else (t_next - t) / rnd
            for x in sharing:
                if finishing and x.left <= least:
                    # on average half of the others' bursts of the last round come after its own
                    done[id(x)] = t_next - (rnd - x.per_burst) / 2
                    xfers.remove(x)
                else:
                    x.left -= rounds
            t = t_next
        return done, t if until is None else max(t, until)

    def transfer(self, owner: object, bursts: int, beats: int, t: int) -> Transfer:
        """A transfer of `owner` starting at `t` (its engine's previous one on this channel is over):
        returns it with the delay it sees now, and moves the ends of the running ones it slows."""
        # an instruction started late by the host (a pause withdrawn) may start before the channel's
        # clock: nothing that ended before that clock may move
        now = max(t, self.now)
        _, self.now = self._run(self.xfers, self.now, t)
        self.xfers = [x for x in self.xfers if x.owner is not owner]
        others = [x for x in self.xfers if x.join <= t]
        queued = 0.0  # the others' bursts the memory has accepted before this one's request
        if others:
            mean = sum(x.per_burst for x in others) / len(others)
            queued = min(self.accepted - 0.5, sum(x.left for x in others)) * mean
        occ = beats + bursts * self.overhead
        ready = t + self.lead
        x = Transfer(owner, bursts, occ, ready + queued, ready + occ, left=float(bursts))
        self.xfers.append(x)
        twins = [copy.copy(y) for y in self.xfers]
        done, _ = self._run(list(twins), t, None)
        for y, z in zip(self.xfers, twins, strict=True):
            delay = max(y.delay, round(done[id(z)] - y.alone_done))
            if delay <= y.delay:
                continue
            if y is not x:
                if y.retime is None or not y.retime(delay - y.delay, now):
                    y.retime = None  # its instruction is over: the rest of its bursts only hold the channel
                    continue
            self.waited += delay - y.delay
            y.delay = delay
        return x


class DramPort:
    """The shared AXI port of the SoC as the SoC's simulation memory (hdl/simdram.py) serves it behind
    the interconnect (hdl/soc.py): reads stream back to back, with four bursts queued behind the one
    being served; a write burst is accepted only when the previous one's response has been taken
    (two cycles per burst)."""

    READ_ACCEPTED = 5
    WRITE_ACCEPTED = 1
    LEAD = 2

    def __init__(self, cfg: NpuConfig):
        self.cfg = cfg
        self.channels = {
            Opcode.LOAD: Channel(self.READ_ACCEPTED, 0, self.LEAD),
            Opcode.STORE: Channel(self.WRITE_ACCEPTED, WRITE_BURST_CYCLES, self.LEAD),
        }

    @property
    def waited(self) -> dict[Opcode, int]:
        """Cycles LOADs and STOREs were slowed down by other engines' transfers."""
        return {op: ch.waited for op, ch in self.channels.items()}

    def transfer(self, owner: object, ins: Instr, t: int) -> Transfer | None:
        """The data of LOAD/STORE `ins` of engine `owner` starting at `t` (None: it moves no data)."""
        f = ins.fields
        args = (f["dram"], f["rows"], f["cols"], f["dram_stride"], self.cfg.bus_bytes)
        beats = dma_beats(*args)
        if not beats:
            return None
        return self.channels[ins.op].transfer(owner, dma_bursts(*args), beats, t)


class NpuSystem:
    """N engines sharing a DRAM and its port, driven like the SoC: `read_reg`/`write_reg` at SoC
    offsets (the SoC block, then one 256-byte window per engine), `run`/`advance` move all engines'
    clocks together."""

    def __init__(self, config: str | NpuConfig = "duo", *, trace: bool = False, timing_only: bool = False):
        self.cfg = get_config(config)
        self.port = DramPort(self.cfg)
        self.dram = np.zeros(self.cfg.dram_bytes, np.uint8)
        self.engines: list[NpuModel] = []
        for _ in range(self.cfg.engines):
            e = NpuModel(self.cfg.engine, trace=trace, timing_only=timing_only)
            e.dram = self.dram  # one DRAM
            e.port = self.port
            self.engines.append(e)
        self.now = 0
        self.irq_mask = (1 << self.cfg.engines) - 1

    # -- memories (shared) -------------------------------------------------------------------------
    def write_dram(self, addr: int, data: bytes | np.ndarray) -> None:
        self.engines[0].write_dram(addr, data)

    def read_dram(self, addr: int, n: int) -> bytes:
        return self.engines[0].read_dram(addr, n)

    @property
    def bus_fault(self) -> tuple[int, int] | None:
        return self.engines[0].bus_fault

    @bus_fault.setter
    def bus_fault(self, rng: tuple[int, int] | None) -> None:
        for e in self.engines:
            e.bus_fault = rng

    # -- registers ---------------------------------------------------------------------------------
    def _window(self, off: int) -> tuple[NpuModel | None, int]:
        i, rel = window_of(off)
        if i < 0:
            return None, rel
        if i < len(self.engines):
            e = self.engines[i]
            e.now = max(e.now, self.now)  # the engine sees the host's clock
            return e, rel
        return None, -1  # unmapped

    def read_reg(self, off: int) -> int:
        e, rel = self._window(off)
        if e is not None:
            return e.read_reg(rel)
        values = {
            "SOC_ID": SOC_MAGIC,
            "SOC_VERSION": ISA_VERSION,
            "SOC_CONFIG_ID": self.cfg.config_id,
            "ENGINES": self.cfg.engines,
            "IRQ_STATUS": self.irq_status,
            "IRQ_MASK": self.irq_mask,
        }
        for name, v in values.items():
            if SOC_REG[name].offset == rel:
                return v
        return 0

    def write_reg(self, off: int, value: int) -> None:
        e, rel = self._window(off)
        if e is not None:
            e.write_reg(rel, value)
        elif rel == SOC_REG["IRQ_MASK"].offset:
            self.irq_mask = value & ((1 << self.cfg.engines) - 1)

    @property
    def irq_status(self) -> int:
        return sum(int(e.irq) << i for i, e in enumerate(self.engines))

    @property
    def irq(self) -> bool:
        """The combined interrupt line."""
        return bool(self.irq_status & self.irq_mask)

    # -- running -----------------------------------------------------------------------------------
    def _simulate(self, until: int | None, stop_when=None) -> None:
        """Process every engine's events in time order up to cycle `until` (None: until no engine
        runs, or `stop_when()` holds after an event)."""
        while True:
            best = None
            for e in self.engines:
                ev = e.next_event()
                if ev is not None and (best is None or ev[0] < best[0]):
                    best = (ev[0], ev[1], e)
            if best is None or (until is not None and best[0] > until):
                break
            t, action, e = best
            action()
            e.now = max(e.now, t)
            self.now = max(self.now, t)
            if stop_when is not None and stop_when():
                return
        if until is not None:
            self.now = max(self.now, until)
            for e in self.engines:
                e.now = max(e.now, until)

    def advance(self, cycles: int) -> None:
        """Let `cycles` cycles pass on every engine."""
        self._simulate(self.now + cycles)

    def run(self, max_cycles: int | None = None) -> None:
        """Simulate until no engine is running (or `max_cycles` pass)."""
        self._simulate(None if max_cycles is None else self.now + max_cycles)

    def run_until_stop(self, max_cycles: int | None = None) -> int | None:
        """Simulate until some engine leaves RUNNING; its index (None: none did within `max_cycles`)."""
        running = [e.status == Status.RUNNING for e in self.engines]
        stopped: list[int] = []

        def any_stopped() -> bool:
            stopped.extend(i for i, e in enumerate(self.engines) if running[i] and e.status != Status.RUNNING)
            return bool(stopped)

        self._simulate(None if max_cycles is None else self.now + max_cycles, any_stopped)
        return stopped[0] if stopped else None
