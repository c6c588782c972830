"""cocotb test of the MAC engine's DSP lane (hdl/micro/mac.py): the Amaranth model `Mac16` uses in
simulation against yosys' own simulation model of the iCE40 `SB_MAC16` with the parameters the
bitstream gets, cycle by cycle on random operands and controls."""

from __future__ import annotations

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, RisingEdge

EDGES = [0, 1, 0x7FFF, 0x8000, 0xFFFF, 0x0080, 0xFF80, 0x007F]


@cocotb.test()
async def model_matches_the_primitive(dut):
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    rng = random.Random(5)
    dut.rst.value = 1
    for name in ("a", "b", "a_load", "b_load", "acc", "clear"):
        getattr(dut, name).value = 0
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    # a known start: both lanes cleared, operands loaded
    dut.clear.value = dut.a_load.value = dut.b_load.value = 1
    await RisingEdge(dut.clk)
    compared = 0
    for cycle in range(4000):
        await FallingEdge(dut.clk)
        if cycle > 2:
            model, prim = int(dut.o_model.value), int(dut.o_prim.value)
            assert model == prim, f"cycle {cycle}: model {model:#010x}, SB_MAC16 {prim:#010x}"
            compared += model != 0
        dut.a.value = rng.choice(EDGES) if rng.random() < 0.3 else rng.getrandbits(16)
        dut.b.value = rng.choice(EDGES) if rng.random() < 0.3 else rng.getrandbits(16)
        dut.a_load.value = int(rng.random() < 0.6)
        dut.b_load.value = int(rng.random() < 0.6)
        dut.acc.value = int(rng.random() < 0.7)
        dut.clear.value = int(rng.random() < 0.02)
    assert compared > 1000  # the sums were not stuck at zero
