"""Timing of a DRAM narrower than the bus, which the fetcher and the load and store units share in
turn (a board's SDR SDRAM: `NpuConfig.dram_word_bytes`, `dram_burst_cycles`).

One memory serves every burst: a transfer (a LOAD's or a STORE's bursts) starts when the memory has
finished the ones before it, and the fetcher's bursts of four instructions take their turn between
a running transfer's bursts (the interconnect grants per burst), which moves that transfer's end.
With a memory as wide as the bus none of this applies: the fetcher and the two DMA units then have
channels of their own (docs/isa.md, Timing).
"""

from __future__ import annotations

from collections.abc import Callable

from npu.config import NpuConfig
from npu.isa import INSTR_BYTES
from npu.timing import FETCH_BURST

#: moves the latest transfer's end by (extra cycles, at cycle now); False when it is already over
Retime = Callable[[int, int], bool]


class NarrowDram:
    def __init__(self, cfg: NpuConfig):
        self.cfg = cfg
        #: cycles one instruction's words take
        self.instr_cycles = INSTR_BYTES // cfg.dram_word_bytes
        #: cycles a fetch burst holds the memory
        self.fetch_cycles = cfg.dma_latency + FETCH_BURST * self.instr_cycles + cfg.dram_burst_cycles
        self.free = 0  # the cycle the memory has served every burst asked for so far
        self._end = 0  # the latest transfer's end,
        self._per_burst = 0.0  # the cycles of each of its bursts
        self._retime: Retime | None = None  # and how to move its end

    def transfer(self, t: int, cycles: int, bursts: int) -> int:
        """A LOAD or STORE asked for at `t` that takes `cycles` alone: the cycles it waits first."""
        start = max(t, self.free)
        self.free = self._end = start + cycles
        self._per_burst = cycles / max(1, bursts)
        self._retime = None
        return start - t

    def retime_with(self, retime: Retime) -> None:
        """How to move the latest transfer's end when a fetch burst takes a turn inside it."""
        self._retime = retime

    def fetch(self, t: int) -> int:
        """A fetch burst asked for at `t`: the cycle its first instruction's words start."""
        if t < self._end:  # after the running transfer's current burst; the transfer ends later
            start = t + min(self._per_burst, self._end - t)
            if self._retime is not None and self._retime(self.fetch_cycles, t):
                self._end += self.fetch_cycles
            self.free += self.fetch_cycles
        else:
            start = max(t, self.free)
            self.free = start + self.fetch_cycles
        return int(start) + self.cfg.dma_latency

    def stop(self, t: int) -> None:
        """The core stopped at `t`: the host's next run finds the memory idle (its accesses take
        far longer than the fetcher's prefetches past the stop, which the model drops)."""
        self.free = min(self.free, t)
        self._end = min(self._end, t)
