"""Waiting many clock cycles in cocotb without Python on every edge.

cocotb's `ClockCycles(clk, n)` awaits `n` rising edges one by one in Python: a long wait runs the
simulation at the speed of the Python callbacks (about 110 k cycles/s for the micro core, where
Verilator alone runs it at about 560 k). `Cycles` ends at the same edge - right after the `n`-th
rising edge - with one simulator timer in between: the first edge, then a timer to the middle of
the cycle before the last, then the last edge.
"""

from __future__ import annotations

from cocotb.triggers import RisingEdge, Timer, Waitable

#: the benches' clock period (`Clock(dut.clk, 10, unit="ns")`)
PERIOD_PS = 10_000


class Cycles(Waitable):
    """`n` rising edges of `clk` (a clock of period `period_ps`): ends where `ClockCycles` would."""

    def __init__(self, clk, n: int, period_ps: int = PERIOD_PS):
        self.clk, self.n, self.period_ps = clk, int(n), period_ps

    async def _wait(self) -> Cycles:
        if self.n <= 0:
            return self
        await RisingEdge(self.clk)
        if self.n > 1:  # to the middle of the cycle after edge n - 1, in the simulator; then edge n
            await Timer((self.n - 2) * self.period_ps + self.period_ps // 2, unit="ps")
            await RisingEdge(self.clk)
        return self
