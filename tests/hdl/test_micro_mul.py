"""The micro core's PCPI multiplier (shift-and-add) against Python's integers: MUL, MULH, MULHSU, MULHU."""

import random

from amaranth.sim import Simulator

from npu.hdl.micro.mul import PcpiMul

CYCLES = 18  # two bits of rs2 a cycle (Booth digits), and the answer

EDGES = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0x80000001, 0xFFFFFFFF, 0xFFFF, 0x10000]


def _expected(a: int, b: int, funct3: int) -> int:
    sa = a - (1 << 32) if a >> 31 else a
    sb = b - (1 << 32) if b >> 31 else b
    return [a * b, (sa * sb) >> 32, (sa * b) >> 32, (a * b) >> 32][funct3] & 0xFFFFFFFF


def test_every_multiply_instruction_matches_python():
    dut = PcpiMul()
    rnd = random.Random(7)
    cases = [(a, b, f) for a in EDGES for b in EDGES for f in range(4)]
    cases += [(rnd.getrandbits(32), rnd.getrandbits(32), rnd.randrange(4)) for _ in range(300)]

    async def bench(ctx):
        for a, b, f3 in cases:
            ctx.set(dut.pcpi.insn, 0b0110011 | f3 << 12 | 1 << 25)  # OP, funct7 = 1 (M extension)
            ctx.set(dut.pcpi.rs1, a)
            ctx.set(dut.pcpi.rs2, b)
            ctx.set(dut.pcpi.valid, 1)
            assert ctx.get(dut.pcpi.wait)
            waited = 0
            while not ctx.get(dut.pcpi.ready):
                assert ctx.get(dut.pcpi.wait)
                await ctx.tick()
                waited += 1
                assert waited <= CYCLES
            assert waited == CYCLES and ctx.get(dut.pcpi.wr)
            assert ctx.get(dut.pcpi.rd) == _expected(a, b, f3), (hex(a), hex(b), f3)
            await ctx.tick()
            ctx.set(dut.pcpi.valid, 0)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def test_other_instructions_are_left_to_the_processor():
    dut = PcpiMul()

    async def bench(ctx):
        for insn in (0b0110011 | 4 << 12 | 1 << 25, 0b0110011, 0b0010011):  # DIV, ADD, ADDI
            ctx.set(dut.pcpi.insn, insn)
            ctx.set(dut.pcpi.valid, 1)
            for _ in range(40):
                assert not ctx.get(dut.pcpi.wait) and not ctx.get(dut.pcpi.ready)
                await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
