"""Pause control: which cancellation point a pause request stops at.

Each unit counts the cancellation-point markers it has passed in this run. When a pause request
arrives (and the core runs), the target becomes the first point no unit has passed yet; units park at
that marker, and the core pauses once all four have (docs/isa.md, "Cancellation points").
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.isa import Unit


def max2(a, b):
    return Mux(a > b, a, b)


class PauseControl(wiring.Component):
    """`passing`: bit u, unit u passes a marker this cycle. `restart`: a run starts (counts cleared).
    `target`/`target_valid`: the point ordinal units park at, while a request is pending."""

    def __init__(self):
        super().__init__(
            {
                "request": In(1),
                "running": In(1),
                "restart": In(1),
                "passing": In(len(Unit)),
                "target": Out(16),
                "target_valid": Out(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        # names kept flat (passed_*, target_valid, pause_target): the bench samples them
        passed = [Signal(16, name=f"passed_{u.name.lower()}") for u in Unit]
        target = Signal(16, name="pause_target")
        valid = Signal(name="target_valid")
        m.d.comb += [self.target.eq(target), self.target_valid.eq(valid)]
        for u in Unit:
            with m.If(self.passing[u]):
                m.d.sync += passed[u].eq(passed[u] + 1)
        # counting the markers passed in this very cycle: a unit passing the point the target would
        # name while the request is latched must not leave the others parked at it for ever. The
        # most passed including this cycle's is the most before it, plus one if a unit at that
        # most passes one now: `passing` (the issue logic's starts) comes in last (Fmax)
        assert len(passed) == 4
        most = max2(max2(passed[0], passed[1]), max2(passed[2], passed[3]))
        ahead = Signal()
        at_most = [self.passing[u] & (p == most) for u, p in zip(Unit, passed, strict=True)]
        m.d.comb += ahead.eq(Cat(*at_most).any())
        with m.If(~self.request):
            m.d.sync += valid.eq(0)
        with m.Elif(self.running & ~valid):
            m.d.sync += [valid.eq(1), target.eq(Mux(ahead, most + 2, most + 1))]
        with m.If(self.restart):
            m.d.sync += [valid.eq(0), *[p.eq(0) for p in passed]]
        return m
