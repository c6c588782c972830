"""Pause control: which cancellation point a pause request stops at.

Each unit counts the cancellation-point markers it has passed in this run, and remembers whether it
has started anything (an instruction, a SYNC, a fence's marker) since the last one. When a pause
request arrives (and the core runs), the target becomes the first point no unit has started anything
after: a unit that has passed point k and started nothing since can still stop there (it holds),
one that has started something after it cannot. Units that have not reached the target park at its
marker; the core pauses once all four are parked or holding (docs/isa.md, "Cancellation points").
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.isa import Unit


def max2(a, b):
    return Mux(a > b, a, b)


class PauseControl(wiring.Component):
    """`passing`: bit u, unit u passes a cancellation-point marker this cycle; `starting`: bit u, it
    starts anything else (an instruction, a SYNC, a fence's marker). `restart`: a run starts (counts
    cleared). `target`/`target_valid`: the point ordinal units park at, while a request is pending;
    `holding`: bit u, unit u has passed the target and started nothing since (it starts nothing)."""

    def __init__(self):
        super().__init__(
            {
                "request": In(1),
                "running": In(1),
                "restart": In(1),
                "passing": In(len(Unit)),
                "starting": In(len(Unit)),
                "target": Out(16),
                "target_valid": Out(1),
                "holding": Out(len(Unit)),
            }
        )

    def elaborate(self, platform):
        m = Module()
        # names kept flat (passed_*, target_valid, pause_target): the bench samples them
        passed = [Signal(16, name=f"passed_{u.name.lower()}") for u in Unit]
        since = [Signal(name=f"started_{u.name.lower()}") for u in Unit]
        target = Signal(16, name="pause_target")
        valid = Signal(name="target_valid")
        m.d.comb += [self.target.eq(target), self.target_valid.eq(valid)]
        for u in Unit:
            with m.If(self.passing[u]):
                m.d.sync += [passed[u].eq(passed[u] + 1), since[u].eq(0)]
            with m.Elif(self.starting[u]):
                m.d.sync += since[u].eq(1)
            m.d.comb += self.holding[u].eq(valid & (passed[u] == target))
        # each unit's least point: the points it has passed, plus one if it has started anything
        # since. Counting this very cycle's passes and starts (a unit leaving the point the target
        # would name while the request is latched must not leave the others parked at it for
        # ever): the most including this cycle is the most before it, plus one if a unit at that
        # most passes or starts now having started nothing since. `passing` and `starting` (the
        # issue logic's starts) come in last (Fmax)
        assert len(passed) == 4
        least = [Signal(16, name=f"least_{u.name.lower()}") for u in Unit]
        for u in Unit:
            m.d.comb += least[u].eq(passed[u] + since[u])
        most = max2(max2(least[0], least[1]), max2(least[2], least[3]))
        ahead = Signal()
        moving = [
            (self.passing[u] | self.starting[u]) & ~since[u] & (least[u] == most)
            for u in Unit
        ]  # fmt: skip
        m.d.comb += ahead.eq(Cat(*moving).any())
        # at least point 1: a request before anything started stops at the first point
        chosen = Mux(ahead, most + 1, Mux(most == 0, 1, most))
        with m.If(~self.request):
            m.d.sync += valid.eq(0)
        with m.Elif(self.running & ~valid):
            m.d.sync += [valid.eq(1), target.eq(chosen)]
        with m.If(self.restart):
            m.d.sync += [valid.eq(0), *[p.eq(0) for p in passed], *[s.eq(0) for s in since]]
        return m
