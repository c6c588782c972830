"""The micro core's multiplier: RISC-V MUL, MULH, MULHSU and MULHU for PicoRV32's co-processor port
(PCPI), shift-and-add in logic cells, two bits of rs2 a cycle (18 cycles a multiply): the UP5K's
eight DSP blocks are the MAC array's (hdl/micro/mac.py).

The operands as the instruction reads them (signed or not) are two's complement numbers A (33 bits)
and B (34); B is taken in radix-4 Booth digits (-2 .. 2: B's bit pairs and the bit below each), so
each step adds 0, A or 2A, or subtracts it (complement and carry in: one adder). `high` accumulates
the product, two bits shifting out into `low` a step. It is not reset with the processor (a soft
reset): a multiply under way finishes within 18 cycles, long before the restarted firmware can ask
for one."""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed
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
        a_signed = (funct3 == 1) | (funct3 == 2)  # MULH, MULHSU
        b_signed = funct3 == 1  # MULH
        a_ext = a[31] & a_signed
        b_ext = b[31] & b_signed
        steps = 17  # Booth digits of B's 34 bits
        # the multiple of A a step adds (`x`, and `neg`: its carry in) is chosen the cycle before,
        # into registers: the digit's multiplexer and the adder were one path
        step = Signal(range(steps + 1))  # the digit chosen next
        high = Signal(signed(36))  # the product past the bits shifted out into `low`
        low = Signal(2 * steps)
        busy = Signal()
        done = Signal()
        index = Mux(busy, step, 0)  # digit 0 when it starts
        trio = Cat(Const(0, 1), b, b_ext.replicate(4)).bit_select(2 * index, 3)  # B's bits 2i - 1 .. 2i + 1
        two = (trio == 0b011) | (trio == 0b100)
        zero = (trio == 0) | (trio == 0b111)
        a36 = Cat(a, a_ext.replicate(4))
        x, neg = Signal(36), Signal()
        m.d.sync += [
            x.eq(Mux(zero, 0, Mux(two, a36 << 1, a36)) ^ (trio[2] & ~zero).replicate(36)),
            neg.eq(trio[2] & ~zero),
        ]
        total = Signal(signed(37))
        m.d.comb += total.eq((Cat(neg, high, high[35]) + Cat(neg, x, x[35]))[1:38])
        m.d.sync += done.eq(0)
        with m.If(p.valid & is_mul & ~busy & ~done):  # digit 0 is chosen now
            m.d.sync += [busy.eq(1), step.eq(1), high.eq(0)]
        with m.Elif(busy):  # shift right by 2: the sum's low bits are the product's bits 2i, 2i + 1
            m.d.sync += [high.eq(total >> 2), low.eq(Cat(low[2:], total[:2])), step.eq(step + 1)]
            with m.If(step == steps):
                m.d.sync += [busy.eq(0), done.eq(1)]
        m.d.comb += [
            p.wait.eq(p.valid & is_mul & ~done),
            p.ready.eq(done),
            p.wr.eq(done),
            p.rd.eq(Mux(funct3 == 0, low[:32], Cat(low[32:], high[:30]))),
        ]
        return m
