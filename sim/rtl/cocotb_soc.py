"""cocotb test bench for `NpuSoc`: several engines run their programs at the same time over one DRAM.

The jobs file (written by `npu.sim.rtl.soc`) lists rounds; in a round every engine given a job starts it
(one register write after the other), and each engine is then driven on its own: paused at a given
cycle of the round if asked, resumed until it stops. The bench records per engine what the single-core
bench records, plus the cycles (since the round began) at which the engine was started and stopped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import cocotb
from cocotb.triggers import ClockCycles, RisingEdge, Timer, ValueChange, with_timeout
from cocotb.utils import get_sim_time

from npu.config import get_config
from npu.registers import RESUME_TOKEN_REGS, SOC_REG, Control, Status
from npu.sim.rtl.cocotb_bench import NpuBench, clear_program
from npu.sim.rtl.cycles import Cycles

PERIOD_NS = 10


def now_cycles() -> int:
    return int(get_sim_time(unit="ns")) // PERIOD_NS


async def wait_engine(dut, engine: int, max_cycles: int) -> None:
    """Wait for engine `engine`'s interrupt line; fail a hung run after `max_cycles`."""

    async def line():
        while not (int(dut.irqs.value) >> engine) & 1:
            await ValueChange(dut.irqs)

    try:
        await with_timeout(line(), PERIOD_NS * max_cycles, "ns")
    except TimeoutError:
        raise AssertionError(f"watchdog: engine {engine} still running after {max_cycles} cycles") from None
    await RisingEdge(dut.clk)


async def drive(bench: NpuBench, e: int, job: dict, t0: int, res: dict) -> None:
    """Run one engine's job to its end: START, an optional pause request at a cycle of the round,
    resume after every pause."""
    pc = 0
    pause_at = job.get("pause_at")
    while True:
        await bench.run_program(job["base"], pc, pause=job.get("pause") == "every", engine=e)
        if not res["runs"]:
            res["start"] = now_cycles() - t0  # START took effect a cycle or two before its response
        res["runs"] += 1
        if pause_at is not None:
            wait = pause_at - (now_cycles() - t0)
            pause_at = None
            if wait > 0:
                await Cycles(bench.dut.clk, wait)
            if not (int(bench.dut.irqs.value) >> e) & 1:
                await bench.write_reg("CONTROL", int(Control.PAUSE | Control.IRQ_ENABLE), engine=e)
                res["pause_requested"] = now_cycles() - t0
        await wait_engine(bench.dut, e, job.get("max_cycles", 5_000_000))
        st = await bench.read_reg("STATUS", engine=e)
        c = await bench.counters(engine=e)
        res["run_cycles"].append(c["CYCLES"])
        for k, v in c.items():
            res["counters"][k] = res["counters"].get(k, 0) + v
        if st == Status.PAUSED:
            cp = await bench.read_reg("CP_ID", engine=e)
            pc = await bench.read_reg("RESUME_PC", engine=e)
            tokens = [await bench.read_reg(n, engine=e) for n in RESUME_TOKEN_REGS]
            res["pauses"].append([cp, pc, *tokens])
            continue
        break
    res["stop"] = now_cycles() - t0
    res["status"] = Status(st).name
    res["error_code"] = await bench.read_reg("ERROR_CODE", engine=e)
    res["error_pc"] = await bench.read_reg("ERROR_PC", engine=e)


@cocotb.test()
async def run_rounds(dut):
    d = Path(os.environ["NPU_JOBS"])
    spec = json.loads((d / "jobs.json").read_text())
    cfg = get_config(spec["config"])  # a preset name, or every field of a test's own
    fast = spec.get("fast_dram", 0)
    bench = NpuBench(dut, cfg, fast, spec.get("stalls", False))
    await bench.reset()
    n = cfg.engines
    # the SoC block
    ident = {name: await bench.regs.read_dword(SOC_REG[name].offset) for name in ("SOC_ID", "ENGINES")}
    clear = clear_program(cfg.engine)
    clear_base = min(fast or cfg.dram_bytes, cfg.dram_bytes) - 4096  # job data are written after it runs
    out = {"soc": ident, "rounds": []}
    for k, rnd in enumerate(spec["rounds"]):
        bench.ram.write(0, bytes(rnd["window"]))
        bench.ram.write(clear_base, clear)
        for e in range(n):
            await bench.run_program(clear_base, engine=e)
        for e in range(n):
            await wait_engine(dut, e, 1_000_000)
            assert await bench.read_reg("STATUS", engine=e) == Status.DONE
        bench.ram.write(clear_base, bytes(len(clear)))
        for addr, name in rnd["dram"]:
            bench.ram.write(addr, (d / name).read_bytes())
        for e in range(n):
            await bench.write_reg("IRQ", 1, engine=e)
        t0 = now_cycles()
        results, tasks = {}, []
        for e_str, job in rnd["jobs"].items():
            e = int(e_str)
            res = results[e_str] = {"pauses": [], "runs": 0, "run_cycles": [], "counters": {}}
            # each engine's coroutine starts its engine at once; register accesses queue up on the
            # one AXI4-Lite master, so the engines start a few cycles apart (recorded)
            tasks.append(cocotb.start_soon(drive(bench, e, job, t0, res)))
        for t in tasks:
            await t
        await Timer(PERIOD_NS, unit="ns")
        (d / f"round{k}.dram").write_bytes(bench.ram.read(0, rnd["window"]))
        out["rounds"].append(
            {"engines": results, "irq_status": await bench.regs.read_dword(SOC_REG["IRQ_STATUS"].offset)}
        )
        for e in range(n):
            await bench.write_reg("CONTROL", int(Control.SOFT_RESET), engine=e)
        await ClockCycles(dut.clk, 2)
    (d / "results.json").write_text(json.dumps(out))
