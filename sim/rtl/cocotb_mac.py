"""cocotb test of the MAC array's DSP column (hdl/micro/mac.py): the Amaranth model `MacColumn` uses
in simulation against yosys' own simulation model of the iCE40 `SB_MAC16` with the parameters the
bitstream gets, and both against the pair sums they stand for, cycle by cycle on random operands
(the extreme bytes often) and random `sub`."""

from __future__ import annotations

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge

EDGES = [0x00, 0x01, 0x7F, 0x80, 0x81, 0xFF]
DELAY = 3  # cycles from the inputs to the pair sums


def _s8(v: int) -> int:
    return v - 256 if v & 0x80 else v


def _expected(a: int, b: int, sub: int, sub_later: int) -> tuple[int, int]:
    """(hi, lo) as 16-bit words; the first block's add uses `sub`, the second's `sub_later`."""
    p = [_s8(a >> 8 * k & 0xFF) * _s8(b >> 8 * k & 0xFF) for k in range(4)]
    first_hi = -p[1] if sub else p[1] - 256
    hi = first_hi - p[3] if sub_later else first_hi + p[3]
    return hi & 0xFFFF, (p[0] + p[2] - 256) & 0xFFFF


def _word(rng: random.Random) -> int:
    return sum((rng.choice(EDGES) if rng.random() < 0.3 else rng.getrandbits(8)) << 8 * k for k in range(4))


@cocotb.test()
async def model_matches_the_primitives_and_the_arithmetic(dut):
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    rng = random.Random(5)
    dut.rst.value = 1
    dut.a.value = dut.b.value = dut.sub.value = 0
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    sent: list[tuple[int, int, int]] = []
    subs: list[int] = []
    compared = extremes = 0
    for cycle in range(4000):
        await FallingEdge(dut.clk)
        model = (int(dut.hi_model.value), int(dut.lo_model.value))
        prim = (int(dut.hi_prim.value), int(dut.lo_prim.value))
        if cycle > DELAY + 1:
            assert model == prim, f"cycle {cycle}: model {model}, SB_MAC16 {prim}"
            a, b, _ = sent[-DELAY]
            # the first block adds in the cycle after the inputs, the second in the one after that
            want = _expected(a, b, subs[-DELAY + 1], subs[-DELAY + 2])
            assert model == want, f"cycle {cycle}: a {a:#010x} b {b:#010x}: {model}, expected {want}"
            compared += 1
            extremes += 0x8000 in want or 0x7F00 in want  # a pair at the end of its range
        a, b = _word(rng), _word(rng)
        if rng.random() < 0.05:  # every byte at the end of its range: the pair sums' extremes
            a, b = 0x80808080, rng.choice([0x80808080, 0x7F7F7F7F])
        sub = int(rng.random() < 0.5) if rng.random() < 0.2 else (subs[-1] if subs else 0)
        dut.a.value, dut.b.value, dut.sub.value = a, b, sub
        sent.append((a, b, sub))
        subs.append(sub)
    assert compared > 3900 and extremes > 50
