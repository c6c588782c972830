"""A simulation model of the board's SPI NOR flash, as far as the micro core's boot loader uses it.

Mode 0 on one data line each way, sampled in the `sync` domain (the boot loader moves SCK at most
every other cycle): READ (0x03, a 24-bit address, then bytes from it for as long as CS_N stays low)
and any other command ignored to its end (release from deep power-down, 0xAB, needs nothing
more). The flash holds `image` at `offset` and 0xFF (erased) everywhere else.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from ..micro.core import flash_signature

READ = 0x03


class SpiFlashModel(wiring.Component):
    def __init__(self, image: bytes, offset: int):
        self.image, self.offset = bytes(image), offset
        super().__init__({"pins": In(flash_signature())})

    def elaborate(self, platform):
        m = Module()
        p = self.pins
        depth = max(1, len(self.image))
        m.submodules.mem = mem = Memory(shape=8, depth=depth, init=list(self.image))
        rd = mem.read_port(domain="comb")
        sck_q = Signal()
        m.d.sync += sck_q.eq(p.sck)
        rise, fall = p.sck & ~sck_q, ~p.sck & sck_q
        phase = Signal(range(3))  # 0: the command, 1: the address, 2: data (READ) or ignored
        count = Signal(range(32))  # bits of the phase so far
        shift = Signal(24)
        read = Signal()  # the command was READ
        addr = Signal(24)  # the byte being sent
        bit = Signal(3)  # its next bit, from the top
        cipo = Signal()
        rel = Signal(24)
        m.d.comb += [rel.eq(addr - self.offset), rd.addr.eq(rel)]
        byte = Mux((addr >= self.offset) & (rel < len(self.image)), rd.data, 0xFF)
        m.d.comb += p.cipo.eq(cipo)
        nxt = Signal(24)  # the bits so far with this one
        is_read = nxt[:8] == READ
        m.d.comb += nxt.eq((shift << 1) | p.copi)
        with m.If(p.cs_n):
            m.d.sync += [phase.eq(0), count.eq(0), read.eq(0), bit.eq(0)]
        with m.Elif(rise & (phase < 2)):
            m.d.sync += [shift.eq(nxt), count.eq(count + 1)]
            with m.If((phase == 0) & (count == 7)):
                m.d.sync += [phase.eq(Mux(is_read, 1, 2)), read.eq(is_read), count.eq(0)]
            with m.If((phase == 1) & (count == 23)):
                m.d.sync += [phase.eq(2), addr.eq(nxt)]
        with m.Elif(fall & (phase == 2) & read):
            m.d.sync += [cipo.eq((byte << bit)[7]), bit.eq(bit + 1)]
            with m.If(bit == 7):
                m.d.sync += addr.eq(addr + 1)
        return m
