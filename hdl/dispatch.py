"""The dispatcher: decodes the fetched instruction, raises the error the fetcher's checks found
(hdl/checks.py), if any, and hands it to the unit queues in program order. A unit instruction (and SYNC) goes
to its unit's queue, a cancellation point (carrying its ordinal) and a FENCE to every queue as
markers; END and BARRIER wait until every queue and unit has drained."""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig
from npu.isa import INSTR_BITS, UNIT_OF, ErrorCode, Opcode, Unit

from .common import QueueEntry, header, view


class Dispatcher(wiring.Component):
    """`enable`: the core runs and no error is pending. `room`: bit u, queue u takes an entry.
    Out: `w_en` (bit u: write `entry` into queue u), `dispatching` (the instruction is taken),
    `stalled`, `error` with `error_code` (the instruction is illegal, or fetched outside DRAM or the
    memory window), and
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
                    # a `bad` marker carries its code (DRAM_RANGE or PROTECTION) from the fetcher
                    self.error_code.eq(Mux(self.fault, ErrorCode.BUS, code)),
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


class UnitQueue(wiring.Component):
    """A unit's instruction queue: the interface and timing of amaranth's `SyncFIFO` (an entry
    written into an empty queue is at the head the next cycle), but the head is a register, a copy
    of the LUT-RAM slot it stands for, so the issue logic starts from flip-flops (Fmax)."""

    def __init__(self, width: int, depth: int):
        self.width, self.depth = width, depth
        super().__init__(
            {
                "w_data": In(width),
                "w_en": In(1),
                "w_rdy": Out(1),
                "r_data": Out(width),
                "r_en": In(1),
                "r_rdy": Out(1),
                "level": Out(range(depth + 1)),
            }
        )

    def elaborate(self, platform):
        m = Module()
        D = self.depth
        level = self.level
        m.d.comb += [self.w_rdy.eq(level != D), self.r_rdy.eq(level != 0)]
        do_read = self.r_rdy & self.r_en
        do_write = self.w_rdy & self.w_en
        m.submodules.storage = storage = Memory(shape=self.width, depth=D, init=[])
        w_port = storage.write_port()
        r_port = storage.read_port(domain="comb")
        produce = Signal(range(D))
        consume = Signal(range(D))
        after = Signal(range(D))  # the slot behind the head
        m.d.comb += [
            after.eq(Mux(consume == D - 1, 0, consume + 1)),
            w_port.addr.eq(produce),
            w_port.data.eq(self.w_data),
            w_port.en.eq(do_write),
            r_port.addr.eq(after),
        ]
        with m.If(do_write):
            m.d.sync += produce.eq(Mux(produce == D - 1, 0, produce + 1))
        with m.If(do_read):
            m.d.sync += consume.eq(after)
        with m.If(do_write & ~do_read):
            m.d.sync += level.eq(level + 1)
        with m.If(do_read & ~do_write):
            m.d.sync += level.eq(level - 1)
        # the next head: the entry behind a head read out, or the one written into a queue that
        # is (or becomes) empty
        head = Signal(self.width)
        m.d.comb += self.r_data.eq(head)
        with m.If(do_read & (level != 1)):
            m.d.sync += head.eq(r_port.data)
        with m.Elif(do_read | (level == 0)):
            m.d.sync += head.eq(self.w_data)
        return m
