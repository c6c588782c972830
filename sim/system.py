"""The golden model of the SoC: `config.engines` engines (`NpuModel`s of `config.engine`) over one DRAM
and one AXI port, behind the SoC's register map (npu/registers.py).

Timing rule of the shared port (docs/isa.md, "Several engines"): AXI reads and writes are separate
channels, each moving one bus word per cycle for all engines together. A LOAD's (STORE's) data beats
begin `dma_latency` cycles after it starts, or when the read (write) channel has finished the beats
of the transfers started before it, whichever is later; the wait adds to the instruction's duration.
The engines' events are processed in time order, so transfers claim the channel in the order they
start. One engine alone never waits (its load unit and its store unit each move one transfer at a
time), so the single-engine timing is unchanged.
"""

from __future__ import annotations

import numpy as np

from npu.config import NpuConfig, get_config
from npu.isa import Instr, Opcode
from npu.registers import ISA_VERSION, SOC_MAGIC, SOC_REG, WINDOW_BYTES, Status
from npu.timing import dma_beats

from .model import NpuModel


class DramPort:
    """Bookkeeping of the shared AXI port: the cycle each channel has moved all claimed beats by."""

    def __init__(self, cfg: NpuConfig):
        self.cfg = cfg
        self.free = {Opcode.LOAD: 0, Opcode.STORE: 0}
        self.waited = {Opcode.LOAD: 0, Opcode.STORE: 0}  # cycles transfers waited for the channel

    def transfer(self, ins: Instr, t: int) -> int:
        """Claim the channel for the data beats of LOAD/STORE `ins` started at `t`; the cycles it
        waits for the channel."""
        f = ins.fields
        beats = dma_beats(f["dram"], f["rows"], f["cols"], f["dram_stride"], self.cfg.bus_bytes)
        if not beats:
            return 0
        first = t + self.cfg.dma_latency
        begin = max(first, self.free[ins.op])
        self.free[ins.op] = begin + beats
        self.waited[ins.op] += begin - first
        return begin - first


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
        k, rel = divmod(off, WINDOW_BYTES)
        if k == 0:
            return None, rel
        if k - 1 < len(self.engines):
            e = self.engines[k - 1]
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
