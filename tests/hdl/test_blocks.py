"""Fast amaranth.sim unit tests of small RTL blocks."""

import random

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st
from npu.hdl.checks import check_instruction
from npu.hdl.common import ByteFifo

from npu.config import ACC_BASE, get_config
from npu.isa import FORMATS, ErrorCode, Instr, IsaError, Opcode, decode, encode, validate

CFGS = [get_config("tiny"), get_config("default")]


class CheckDut(wiring.Component):
    word: In(256)
    code: Out(8)

    def __init__(self, cfg):
        self.cfg = cfg
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.code.eq(check_instruction(m, self.word, self.cfg))
        return m


def _near(cfg):
    """Values near every boundary the checks care about."""
    edges = [
        0,
        1,
        2,
        3,
        4,
        7,
        8,
        15,
        16,
        17,
        31,
        32,
        63,
        64,
        255,
        256,
        cfg.spad_bytes - 16,
        cfg.spad_bytes - 1,
        cfg.spad_bytes,
        ACC_BASE - 4,
        ACC_BASE,
        ACC_BASE + 4,
        ACC_BASE + 16,
        ACC_BASE + cfg.acc_bytes - 16,
        ACC_BASE + cfg.acc_bytes,
        cfg.dram_bytes - 64,
        cfg.dram_bytes,
        cfg.dram_bytes - 1,
    ]
    return edges


def plausible_words(cfg, n, seed):
    """Instruction words that sit near every rule's edge, plus a few corrupted ones."""
    rng = random.Random(seed)
    near = _near(cfg)
    words = []
    for _ in range(n):
        op = rng.choice(list(Opcode))
        fields = {}
        for f in FORMATS[op]:
            if f.kind == "enum":
                v = rng.randrange(1 << f.width)
                v = min(v, len(f.choices) - 1) if rng.random() < 0.9 else v
            elif f.width >= 20 and rng.random() < 0.6:
                v = rng.choice(near)
            elif rng.random() < 0.5:
                v = rng.choice([0, 1, 2, 3, 4, 5, 8, 16])
            else:
                v = rng.randint(f.lo, f.hi)
            fields[f.name] = max(f.lo, min(f.hi, v))
        wait = rng.randrange(16) if rng.random() < 0.3 else 0
        signal = rng.randrange(16) if rng.random() < 0.3 else 0
        word = 0
        try:
            word = int.from_bytes(encode(Instr(op, fields, wait, signal)), "little")
        except IsaError:  # an enum value out of range: pack by hand
            word = int(op)
        if rng.random() < 0.05:
            word |= 1 << rng.randrange(12, 256)
        if rng.random() < 0.03:
            word = (word & ~0xF) | rng.randrange(16)
        words.append(word)
    return words


def python_code(word, cfg) -> int:
    try:
        validate(decode(word.to_bytes(32, "little")), cfg)
    except IsaError as e:
        return int(e.code)
    return 0


@pytest.mark.parametrize("cfg", CFGS, ids=lambda c: c.name)
def test_hardware_checks_match_isa_validate(cfg):
    words = plausible_words(cfg, 600, seed=cfg.config_id)
    dut = CheckDut(cfg)
    got = []

    async def bench(ctx):
        for w in words:
            ctx.set(dut.word, w)
            got.append(ctx.get(dut.code))

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    codes = [python_code(w, cfg) for w in words]
    seen = {ErrorCode(c).name for c in codes}
    assert {"NONE", "ILLEGAL_FIELD", "MISALIGNED", "SPAD_RANGE", "DRAM_RANGE"} <= seen
    mismatches = [(hex(w), c, g) for w, c, g in zip(words, codes, got, strict=True) if c != g]
    assert not mismatches, mismatches[:5]


@settings(max_examples=30)
@given(
    st.lists(
        st.tuples(st.integers(0, 8), st.integers(0, 8), st.binary(min_size=8, max_size=8)),
        min_size=1,
        max_size=60,
    )
)
def test_byte_fifo_is_a_byte_queue(ops):
    W = 8
    dut = ByteFifo(W)
    model: list[int] = []

    async def bench(ctx):
        for push_n, pop_n, data in ops:
            count = ctx.get(dut.count)
            assert count == len(model)
            assert ctx.get(dut.data).to_bytes(W, "little")[: min(count, W)] == bytes(model[:W])
            pop = min(pop_n, count, W)
            ctx.set(dut.pop_n, pop)
            ready = ctx.get(dut.push_ready)
            ctx.set(dut.push_valid, 1)
            ctx.set(dut.push_n, push_n)
            ctx.set(dut.push_data, int.from_bytes(data, "little"))
            await ctx.tick()
            del model[:pop]
            if ready:
                model.extend(data[:push_n])

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
