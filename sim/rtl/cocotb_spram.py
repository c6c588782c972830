"""cocotb tests of the SPRAM adapter (hdl/mem/spram.py) with its simulation models of the SPRAMs.

cocotbext-axi's `AxiMaster` drives random bursts from several concurrent workers (each owning a
slice of the memory, so its reads have one right answer) against a Python reference memory; the
master stalls every channel at random, R and B included (back-pressure on the adapter). Another
test measures a long read burst's beats per cycle without stalls.
"""

from __future__ import annotations

import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiBus, AxiMaster

from npu.sim.rtl.cocotb_bench import random_stalls

SIZE = int(os.environ.get("SPRAM_BYTES", 128 * 1024))
BEAT = int(os.environ.get("SPRAM_BEAT", 8))


async def setup(dut, stalls: bool):
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    axi = AxiMaster(AxiBus.from_prefix(dut, "s_axi"), dut.clk, dut.rst)
    if stalls:
        channels = (
            axi.read_if.ar_channel,
            axi.read_if.r_channel,
            axi.write_if.aw_channel,
            axi.write_if.w_channel,
            axi.write_if.b_channel,
        )
        for seed, ch in enumerate(channels):
            ch.set_pause_generator(random_stalls(100 + seed, 0.3))
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 2)
    return axi


@cocotb.test()
async def random_traffic(dut):
    """Concurrent random writes and reads (unaligned, partial words, up to 256 beats) with stalls."""
    axi = await setup(dut, stalls=True)
    ref = bytearray(SIZE)
    workers, ops = 4, int(os.environ.get("SPRAM_OPS", 30))
    part = SIZE // workers

    async def worker(w: int):
        rng = random.Random(w)
        base = w * part
        for _ in range(ops):
            n = rng.choice([1, 3, BEAT, rng.randrange(1, 64), rng.randrange(1, 256 * BEAT)])
            addr = base + rng.randrange(0, part - n)
            if rng.random() < 0.5:
                data = bytes(rng.randrange(256) for _ in range(n))
                await axi.write(addr, data)
                ref[addr : addr + n] = data
            else:
                got = (await axi.read(addr, n)).data
                assert bytes(got) == bytes(ref[addr : addr + n]), f"worker {w}: read {n} bytes at {addr:#x}"

    tasks = [cocotb.start_soon(worker(w)) for w in range(workers)]
    for t in tasks:
        await t
    # everything written reads back, across the block boundaries of the memory
    for addr in range(0, SIZE, 8192):
        got = (await axi.read(addr, 8192)).data
        assert bytes(got) == bytes(ref[addr : addr + 8192]), f"final read-back at {addr:#x}"


@cocotb.test()
async def read_throughput(dut):
    """A 256-beat read burst streams about one beat per cycle."""
    axi = await setup(dut, stalls=False)
    data = bytes(random.Random(7).randrange(256) for _ in range(256 * BEAT))
    await axi.write(0x1000, data)
    start = 0
    cycles = 0

    async def count():
        nonlocal cycles
        while True:
            await RisingEdge(dut.clk)
            cycles += 1

    counter = cocotb.start_soon(count())
    start = cycles
    got = (await axi.read(0x1000, len(data))).data
    took = cycles - start
    counter.cancel()
    assert bytes(got) == data
    dut._log.warning(f"256-beat read: {took} cycles ({256 / took:.2f} beats per cycle)")
    assert 256 / took > 0.9, f"256-beat read took {took} cycles"
