"""Performance counters (the 64-bit registers of npu/registers.py), counted while the core runs and
cleared when a run starts. Each cycle's events are counted one cycle later."""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.isa import Unit
from npu.registers import REGISTERS

COUNTER_NAMES = [r.name for r in REGISTERS if r.wide]


class PerfCounters(wiring.Component):
    """Inputs are this cycle's events: `busy` (bit u: unit u is busy), a `stalled` dispatch, a
    `retired` (dispatched) instruction, and the bytes a starting LOAD / STORE moves. One output per
    counter register, named after it in lower case."""

    def __init__(self):
        super().__init__(
            {
                "running": In(1),
                "restart": In(1),
                "busy": In(len(Unit)),
                "stalled": In(1),
                "retired": In(1),
                "rd_bytes": In(32),
                "wr_bytes": In(32),
                **{name.lower(): Out(64) for name in COUNTER_NAMES},
                "cycles_next": Out(64),  # CYCLES from the next cycle on
            }
        )

    def elaborate(self, platform):
        m = Module()
        cnt = {name: Signal(64, name=f"cnt_{name.lower()}") for name in COUNTER_NAMES}
        for name, s in cnt.items():
            m.d.comb += getattr(self, name.lower()).eq(s)
        # the events are registered first and counted a cycle later: the 64-bit adds then start at
        # flip-flops instead of at the end of the core's issue logic (Fmax)
        busy = Signal.like(self.busy)
        stalled, retired, running = Signal(), Signal(), Signal()
        rd_bytes, wr_bytes = Signal.like(self.rd_bytes), Signal.like(self.wr_bytes)
        m.d.sync += [
            busy.eq(self.busy),
            stalled.eq(self.stalled),
            retired.eq(self.retired),
            running.eq(self.running & ~self.restart),  # the restart cycle is not counted (as before)
            rd_bytes.eq(self.rd_bytes),
            wr_bytes.eq(self.wr_bytes),
        ]
        events = {
            "CYCLES": 1,
            **{f"BUSY_{u.name}": busy[u] for u in Unit},
            "STALL_DISPATCH": stalled,
            "INSTRET": retired,
            "DMA_RD_BYTES": rd_bytes,
            "DMA_WR_BYTES": wr_bytes,
        }
        assert set(events) == set(cnt), "every counter register has an event"
        with m.If(running):
            for name, inc in events.items():
                m.d.sync += cnt[name].eq(cnt[name] + inc)
        with m.If(self.restart):
            m.d.sync += [s.eq(0) for s in cnt.values()]
        m.d.comb += self.cycles_next.eq(Mux(self.restart, 0, cnt["CYCLES"] + running))
        return m
