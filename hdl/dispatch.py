"""The dispatcher: decodes the fetched instruction, raises the error the fetcher's checks found
(hdl/checks.py), if any, and hands it to the unit queues in program order. A unit instruction (and SYNC) goes
to its unit's queue, a cancellation point (carrying its ordinal) and a FENCE to every queue as
markers; END and BARRIER wait until every queue and unit has drained."""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig
from npu.isa import INSTR_BITS, UNIT_OF, ErrorCode, Opcode, Unit

from .common import QueueEntry, header, view


class Dispatcher(wiring.Component):
    """`enable`: the core runs and no error is pending. `room`: bit u, queue u takes an entry.
    Out: `w_en` (bit u: write `entry` into queue u), `dispatching` (the instruction is taken),
    `stalled`, `error` with `error_code` (the instruction is illegal, or fetched outside DRAM), and
    `end` (END taken: the program is complete)."""

    def __init__(self, cfg: NpuConfig):
        self.cfg = cfg
        n = len(Unit)
        super().__init__(
            {
                "instr": In(INSTR_BITS),
                "code": In(ErrorCode),  # the instruction's check result
                "pc": In(32),
                "valid": In(1),
                "bad": In(1),
                "fault": In(1),  # the memory answered the fetch of this instruction with an error
                "enable": In(1),
                "room": In(n),
                "drained": In(1),
                "restart": In(1),
                "w_en": Out(n),
                "entry": Out(QueueEntry),
                "dispatching": Out(1),
                "stalled": Out(1),
                "error": Out(1),
                "error_code": Out(ErrorCode),
                "end": Out(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        instr = self.instr
        code = self.code
        op = header(instr).opcode
        points = Signal(16)  # cancellation points dispatched in this run
        m.d.comb += [self.entry.instr.eq(instr), self.entry.pc.eq(self.pc), self.entry.ordinal.eq(points + 1)]

        target = Signal(Unit)
        is_unit_op = Signal()
        with m.Switch(op):
            for o, u in UNIT_OF.items():
                if u is not None:
                    with m.Case(o):
                        m.d.comb += [target.eq(u), is_unit_op.eq(1)]
            with m.Case(Opcode.SYNC):  # a SYNC goes to the unit its field names
                m.d.comb += [target.eq(view(Opcode.SYNC, instr).unit), is_unit_op.eq(1)]

        with m.If(self.enable & self.valid):
            with m.If(self.bad | self.fault | (code != 0)):
                m.d.comb += [
                    self.error.eq(1),
                    self.error_code.eq(
                        Mux(self.bad, ErrorCode.DRAM_RANGE, Mux(self.fault, ErrorCode.BUS, code))
                    ),
                ]
            with m.Elif(is_unit_op):
                with m.If(self.room.bit_select(target, 1)):
                    m.d.comb += [self.dispatching.eq(1), self.w_en.bit_select(target, 1).eq(1)]
                with m.Else():
                    m.d.comb += self.stalled.eq(1)
            with m.Elif((op == Opcode.CANCEL_POINT) | (op == Opcode.FENCE)):  # markers
                with m.If(self.room.all()):
                    m.d.comb += [self.dispatching.eq(1), self.w_en.eq(-1)]
                    with m.If(op == Opcode.CANCEL_POINT):
                        m.d.sync += points.eq(points + 1)
                with m.Else():
                    m.d.comb += self.stalled.eq(1)
            with m.Else():  # END and BARRIER wait for the drain
                with m.If(self.drained):
                    m.d.comb += [self.dispatching.eq(1), self.end.eq(op == Opcode.END)]
                with m.Else():
                    m.d.comb += self.stalled.eq(1)
        with m.If(self.restart):
            m.d.sync += points.eq(0)
        return m
