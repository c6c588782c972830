"""Timing of a DRAM narrower than the bus, which the fetcher and the load and store units share
(a board's SDR SDRAM: `NpuConfig.dram_word_bytes`, `dram_burst_cycles`).

One memory serves one burst at a time, and the memory takes the bursts asked for in turn, as the
board's interconnect and SDRAM controller do (docs/isa.md, Timing):

* a transfer (a LOAD's or a STORE's bursts) asked for while the other DMA unit's transfer runs
  shares the memory with it burst by burst - the controller takes a waiting read and a waiting
  write alternately - so each moves the other's end: the running one ends later by the new one's
  bursts that fall inside it, and the new one ends after the running one's bursts between its own;
* otherwise a transfer starts when the memory has served the bursts asked for before it;
* the fetcher's bursts (four instructions to fill its buffer, then refills of two) take their turn
  after the running transfers' current burst, which moves their ends.

With a memory as wide as the bus none of this applies: the fetcher and the two DMA units then have
channels of their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from npu.config import NpuConfig
from npu.isa import INSTR_BYTES

#: moves a transfer's end by (extra cycles, at cycle now); False when it is already over
Retime = Callable[[int, int], bool]


@dataclass
class _Transfer:
    end: float  # the cycle its last burst ends
    per_burst: float  # the cycles each of its bursts holds the memory
    write: bool
    retime: Retime | None = None

    def move(self, extra: float, now: int) -> None:
        """Another burst took a turn inside this transfer: it ends `extra` cycles later."""
        self.end += extra
        if self.retime is not None and not self.retime(round(extra), now):
            self.retime = None  # its instruction has ended (or the run): nothing more to move


class NarrowDram:
    def __init__(self, cfg: NpuConfig):
        self.cfg = cfg
        #: cycles one instruction's words take
        self.instr_cycles = INSTR_BYTES // cfg.dram_word_bytes
        self.free = 0.0  # the cycle the memory has served every burst asked for so far
        self._running: list[_Transfer] = []  # the DMA transfers not over (at most a read and a write)

    def _live(self, t: int) -> list[_Transfer]:
        self._running = [x for x in self._running if x.end > t]
        return self._running

    def transfer(self, t: int, cycles: int, bursts: int, write: bool) -> int:
        """A LOAD (`write` False) or STORE asked for at `t` that takes `cycles` alone in `bursts`
        bursts: the cycles it takes beyond those (its wait for the memory, others' bursts inside)."""
        n = max(1, bursts)
        per = cycles / n
        other = next((x for x in self._live(t) if x.write != write), None)
        if other is not None:  # the two alternate burst by burst from the running one's current burst
            left = max(1, math.ceil((other.end - t) / other.per_burst))  # its bursts not yet served
            first = t + min(other.per_burst, other.end - t)  # this one's first burst starts
            end = first + cycles + min(n - 1, left - 1) * other.per_burst
            other.move(min(n, left) * per, t)
            self.free = max(self.free + cycles, end, other.end)
        else:
            end = max(t, self.free) + cycles
            self.free = end
        self._running.append(_Transfer(end, per, write))
        return math.ceil(end) - t - cycles

    def retime_with(self, retime: Retime) -> None:
        """How to move the latest transfer's end when other bursts take turns inside it."""
        if self._running:
            self._running[-1].retime = retime

    def fetch_cycles(self, instrs: int) -> int:
        """Cycles a fetch burst of `instrs` instructions holds the memory (its words arrive
        `dma_latency` later, while the memory serves the next burst)."""
        return instrs * self.instr_cycles + self.cfg.dram_burst_cycles

    def fetch(self, t: int, instrs: int) -> int:
        """A fetch burst of `instrs` instructions asked for at `t`: the cycle its first
        instruction's words start."""
        hold = self.fetch_cycles(instrs)
        running = self._live(t)
        if running:  # after the current burst; the running transfers end later
            start = t + min(min(x.per_burst, x.end - t) for x in running)
            for x in running:
                x.move(hold, t)
            self.free += hold
        else:
            start = max(t, self.free)
            self.free = start + hold
        return int(start) + self.cfg.dma_latency

    def stop(self, t: int) -> None:
        """The core stopped at `t`: the host's next run finds the memory idle (its accesses take
        far longer than the fetcher's prefetches past the stop, which the model drops)."""
        self.free = min(self.free, t)
        for x in self._running:
            x.end = min(x.end, t)
        self._running = []
