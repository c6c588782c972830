"""The micro core's multiplier: RISC-V MUL, MULH, MULHSU and MULHU for PicoRV32's co-processor port
(PCPI) on four 16 x 16 multipliers (the UP5K's DSP blocks), in two cycles, instead of
PicoRV32's shift-and-add multiplier (about 40 cycles and some 400 logic cells).

The 32 x 32 product is formed unsigned from the four 16-bit partial products; a signed operand
that is negative then subtracts the other operand from the high word (two's complement)."""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


class PcpiSignature(wiring.Signature):
    """PicoRV32's PCPI, seen from the processor."""

    def __init__(self):
        super().__init__(
            {
                "valid": Out(1),
                "insn": Out(32),
                "rs1": Out(32),
                "rs2": Out(32),
                "wr": In(1),
                "rd": In(32),
                "wait": In(1),
                "ready": In(1),
            }
        )


class PcpiMul(wiring.Component):
    def __init__(self):
        super().__init__({"pcpi": In(PcpiSignature())})

    def elaborate(self, platform):
        m = Module()
        p = self.pcpi
        insn, a, b = p.insn, p.rs1, p.rs2  # held by the processor while it waits
        # OP (0110011) with funct7 = 1 and funct3 0..3: MUL, MULH, MULHSU, MULHU
        is_mul = (insn[0:7] == 0b0110011) & (insn[25:32] == 1) & ~insn[14]
        funct3 = insn[12:14]
        # combinational from the held operands (a cycle is 83 ns at 12 MHz), answered a cycle later
        done = Signal()
        m.d.sync += done.eq(p.valid & is_mul & ~done)
        pp = [a[:16] * b[:16], a[:16] * b[16:], a[16:] * b[:16], a[16:] * b[16:]]
        product = Signal(64)
        m.d.comb += product.eq(pp[0] + ((pp[1] + pp[2]) << 16) + (pp[3] << 32))
        a_neg = a[31] & ((funct3 == 1) | (funct3 == 2))  # MULH, MULHSU: rs1 signed
        b_neg = b[31] & (funct3 == 1)  # MULH: rs2 signed
        hi = Signal(32)
        m.d.comb += hi.eq(product[32:] - Mux(a_neg, b, 0) - Mux(b_neg, a, 0))
        m.d.comb += [
            p.wait.eq(p.valid & is_mul & ~done),
            p.ready.eq(done),
            p.wr.eq(done),
            p.rd.eq(Mux(funct3 == 0, product[:32], hi)),
        ]
        return m
