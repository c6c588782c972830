"""cocotb test bench for `NpuCore`: DRAM is cocotbext-axi's `AxiRam`, registers go through its
`AxiLiteMaster`. The bench runs a list of jobs (written by `npu.sim.rtl.core`) and records what the
hardware did, so pytest can compare it with the golden model.

Each job: clear the on-chip memories, write DRAM, run the program (optionally pausing at every
cancellation point, or at given cycles, and resuming), then record status, error code, pc, pause
points, performance counters and the DRAM window. A cycle watchdog fails a hung run.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.handle import Immediate
from cocotb.triggers import ClockCycles, FallingEdge, First, RisingEdge, Timer
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam

from npu.arith import round_up
from npu.config import get_config
from npu.isa import encode_program, make
from npu.registers import COUNTERS, REG, RESUME_TOKEN_REGS, Control, Status, engine_window
from npu.sim.rtl.cycles import Cycles
from npu.sim.rtl.hdlsim import PROFILE_ENV


class FastDram:
    """DRAM held in the simulator (hdl/simdram.py), read and written through its array handle."""

    def __init__(self, mem, width: int, size: int):
        self.mem, self.W, self.size = mem, width, size

    def write(self, addr: int, data: bytes) -> None:
        W = self.W
        a0, a1 = addr - addr % W, round_up((addr + len(data)), W)
        buf = (
            bytearray(self.read(a0, a1 - a0)) if (a0, a1) != (addr, addr + len(data)) else bytearray(a1 - a0)
        )
        buf[addr - a0 : addr - a0 + len(data)] = data
        # written without delay: a scheduled (inertial) write waits for the next ReadWrite phase, and
        # one issued from a value-change callback (the driver waking on an interrupt) was seen lost
        for i in range(0, len(buf), W):
            self.mem[(a0 + i) // W].value = Immediate(int.from_bytes(buf[i : i + W], "little"))

    def read(self, addr: int, n: int) -> bytes:
        W = self.W
        a0, a1 = addr - addr % W, round_up((addr + n), W)
        out = b"".join(int(self.mem[i].value).to_bytes(W, "little") for i in range(a0 // W, a1 // W))
        return out[addr - a0 : addr - a0 + n]


def random_stalls(seed: int, p: float = 0.25) -> Iterator[bool]:
    """A pause generator for a cocotbext-axi channel: pause on about `p` of the cycles (seeded)."""
    rng = random.Random(seed)
    while True:
        yield rng.random() < p


class NpuBench:
    """Small driver for the core in simulation: registers, DRAM and run control."""

    def __init__(self, dut, config, fast_dram_size: int = 0, stalls: bool = False):
        self.dut = dut
        self.cfg = get_config(config)
        if fast_dram_size:  # stalls, if any, come from the in-simulator RAM (its stall_en port)
            self.ram = FastDram(dut.core.dram.mem.mem, self.cfg.bus_bytes, fast_dram_size)
            dut.stall_en.value = int(stalls)
        else:
            if hasattr(dut, "ext_dram"):  # the sim top (hdl/simdram.py): its bus port, not its RAM
                dut.ext_dram.value = 1
            self.ram = AxiRam(AxiBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst, size=self.cfg.dram_bytes)
            if stalls:
                channels = (
                    self.ram.read_if.ar_channel,
                    self.ram.read_if.r_channel,
                    self.ram.write_if.aw_channel,
                    self.ram.write_if.w_channel,
                    self.ram.write_if.b_channel,
                )
                for seed, ch in enumerate(channels):
                    ch.set_pause_generator(random_stalls(seed))
        self.regs = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)
        self.cycle = 0

    def set_bus_fault(self, lo: int, hi: int) -> None:
        """Make the memory answer bus beats in [lo, hi) with SLVERR (reads bring zeros, writes are
        dropped): the in-simulator RAM's fault ports, or AxiRam's read and write hooks wrapped
        (cocotbext-axi answers SLVERR when they raise)."""
        if isinstance(self.ram, FastDram):
            self.dut.fault_lo.value, self.dut.fault_hi.value = lo, hi
            return
        W = self.cfg.bus_bytes
        for iface, op in ((self.ram.read_if, "_read"), (self.ram.write_if, "_write")):
            plain = getattr(type(iface), op).__get__(iface)

            async def hook(address, arg, plain=plain):
                if lo <= address // W * W < hi:
                    raise OSError(f"bus fault at 0x{address:x}")
                return await plain(address, arg)

            setattr(iface, op, hook)

    async def reset(self) -> None:
        cocotb.start_soon(Clock(self.dut.clk, 10, unit="ns").start())
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)

    # `engine`: a register of that engine's window on a SoC (None: the core's own register port)
    @staticmethod
    def _offset(name: str, engine: int | None) -> int:
        return REG[name].offset + (engine_window(engine) if engine is not None else 0)

    async def read_reg(self, name: str, engine: int | None = None) -> int:
        return await self.regs.read_dword(self._offset(name, engine))

    async def write_reg(self, name: str, value: int, engine: int | None = None) -> None:
        await self.regs.write_dword(self._offset(name, engine), value)

    async def counters(self, engine: int | None = None) -> dict[str, int]:
        out = {}
        for name in COUNTERS:
            lo = await self.regs.read_dword(self._offset(name, engine))
            hi = await self.regs.read_dword(self._offset(name, engine) + 4)
            out[name] = lo | hi << 32
        return out

    async def wait_stop(self, max_cycles: int) -> None:
        """Wait for the interrupt (STATUS left RUNNING); fail a hung run after `max_cycles`."""
        if self.dut.irq.value == 1:
            return
        edge = RisingEdge(self.dut.irq)
        res = await First(edge, Timer(10 * max_cycles, unit="ns"))
        if res is not edge:
            raise AssertionError(f"watchdog: core still running after {max_cycles} cycles")
        await RisingEdge(self.dut.clk)

    async def run_program(
        self, base: int, pc: int = 0, pause: bool = False, engine: int | None = None
    ) -> None:
        await self.write_reg("PROGRAM_BASE", base, engine)
        await self.write_reg("RESUME_PC", pc, engine)
        await self.write_reg("IRQ", 1, engine)
        await self.write_reg(
            "CONTROL", int(Control.START | Control.IRQ_ENABLE | (Control.PAUSE if pause else 0)), engine
        )


def clear_program(cfg) -> bytes:
    """Zero the scratchpad and accumulators with padding-only loads (no DRAM traffic)."""
    out = []
    for base, size in ((0, cfg.spad_bytes), (0x80000, cfg.acc_bytes)):
        width = min(size, 32768)
        out.append(
            make(
                "load",
                spad=base,
                rows=0,
                cols=0,
                pad_top=size // width,
                pad_left=width,
                spad_stride=width,
                pad_value=0,
            )
        )
    out.append(make("end"))
    return encode_program(out)


UNIT_NAMES = ("load", "matrix", "vector", "store")


async def watch_pause_latch(dut, res: dict) -> None:
    """Record, when the core latches a pause request, how many cancellation points the most advanced
    unit had passed (sampled mid-cycle, when the registers are stable, in the first cycle the target
    holds: markers passed in the latching cycle count) and the target point the core chose.
    docs/isa.md: the target is the first point no unit has started anything after."""
    # the pause control of NpuCore: the Verilog top wraps the core (dut.core), or the sim top that
    # holds it (dut.core.core)
    core = dut.core if hasattr(dut.core, "pause") or hasattr(dut.core, "pause_target") else dut.core.core
    if hasattr(core, "pause"):
        core = core.pause
        passed = [getattr(core, f"passed_{u}") for u in UNIT_NAMES]
    else:  # the micro core: its firmware reports the latch (hdl/micro/memmap.py, MMIO_PAUSE_PROBE)
        passed = [core.passed_max]
    await FallingEdge(dut.clk)
    if core.target_valid.value != 1:  # the simulator watches the flag, not a Python loop per cycle
        await RisingEdge(core.target_valid)
        await FallingEdge(dut.clk)
    res["pause_passed"] = max(int(p.value) for p in passed)
    res["pause_target"] = int(core.pause_target.value)


async def sample_pc(dut, counts: dict[int, int]) -> None:
    """Count the cycles the micro core's processor spends at each PC (PicoRV32's `reg_pc`, made
    visible by the profiler's build: hdlsim.PROFILE_ENV)."""
    pc, clk = dut.core.core.cpu.cpu.reg_pc, dut.clk
    while True:
        await RisingEdge(clk)
        v = pc.value.to_unsigned()
        counts[v] = counts.get(v, 0) + 1


@cocotb.test()
async def run_jobs(dut):
    jobs_path = Path(os.environ["NPU_JOBS"])
    spec = json.loads((jobs_path / "jobs.json").read_text())
    fast = spec.get("fast_dram", 0)
    bench = NpuBench(dut, spec["config"], fast, spec.get("stalls", False))
    await bench.reset()
    cfg = bench.cfg
    clear = clear_program(cfg)
    # the micro core's firmware zeroes its 40 KiB a word at a time (about 240,000 cycles, longer
    # than most jobs): the bench writes its SPRAM models' words instead (a SpramModel per 16 bits)
    onchip, onchip_words = None, (cfg.spad_bytes + cfg.acc_bytes) // 4
    if cfg.core == "micro":
        onchip = [getattr(dut.core.core, f"spram{i}").mem for i in range(2)]
    clear_base = min(fast or cfg.dram_bytes, cfg.dram_bytes) - 4096  # job data are written after it runs
    results = []
    for job in spec["jobs"]:
        window = job["window"]
        bench.ram.write(0, bytes(window))
        if onchip is not None:  # the micro core: its SPRAM models, zeroed directly
            for block in onchip:
                for i in range(onchip_words):
                    block[i].value = Immediate(0)
        else:
            bench.ram.write(clear_base, clear)
            await bench.run_program(clear_base)
            await bench.wait_stop(1_000_000)
            assert await bench.read_reg("STATUS") == Status.DONE
            bench.ram.write(clear_base, bytes(len(clear)))
        for addr, name in job["dram"]:
            bench.ram.write(addr, (jobs_path / name).read_bytes())
        await bench.write_reg("TIMEOUT", job.get("timeout", 0))
        bench.set_bus_fault(*(job.get("bus_fault") or (0, 0)))
        lo, hi = job.get("dram_window") or (0, 0)
        await bench.write_reg("DRAM_BASE", lo)
        await bench.write_reg("DRAM_LIMIT", hi)
        res = {"name": job["name"], "pauses": [], "runs": 0, "run_cycles": []}
        t_job = time.perf_counter()
        pause_mode = job.get("pause", "none")
        pc = 0
        total = dict.fromkeys(COUNTERS, 0)
        start_cycle = 0
        pause_at = sorted(job.get("pause_at", []))
        run_wall = 0.0
        pcs: dict[int, int] = {}
        profiler = cocotb.start_soon(sample_pc(dut, pcs)) if os.environ.get(PROFILE_ENV) else None
        while True:
            t_run = time.perf_counter()
            await bench.run_program(job["base"], pc, pause=pause_mode == "every")
            res["runs"] += 1
            if pause_at:
                # raise a pause request at a given cycle of the first run, watching the progress
                # the core has made when it latches the request
                at = pause_at.pop(0)
                monitor = cocotb.start_soon(watch_pause_latch(dut, res))
                n = max(0, at - start_cycle)
                if n and dut.irq.value == 0:  # n clock edges, or until the core stops first
                    await First(Cycles(dut.clk, n), RisingEdge(dut.irq))
                if dut.irq.value == 0:
                    await bench.write_reg("CONTROL", int(Control.PAUSE | Control.IRQ_ENABLE))
                await bench.wait_stop(job.get("max_cycles", 5_000_000))
                monitor.cancel()
            await bench.wait_stop(job.get("max_cycles", 5_000_000))
            st = await bench.read_reg("STATUS")
            while st == Status.RUNNING:  # a FENCE's interrupt: the run goes on
                await bench.write_reg("IRQ", 1)
                st = await bench.read_reg("STATUS")  # read after the clear: a stop is not missed
                if st == Status.RUNNING:
                    await bench.wait_stop(job.get("max_cycles", 5_000_000))
                    st = await bench.read_reg("STATUS")
            run_wall += time.perf_counter() - t_run
            c = await bench.counters()
            res["run_cycles"].append(c["CYCLES"])
            for k, v in c.items():
                total[k] += v
            start_cycle += c["CYCLES"]
            if st == Status.PAUSED:
                cp = await bench.read_reg("CP_ID")
                pc = await bench.read_reg("RESUME_PC")
                tokens = [await bench.read_reg(n) for n in RESUME_TOKEN_REGS]
                res["pauses"].append([cp, pc, *tokens])
                # as a driver that runs other work in between: clear them, then write them back
                for n in RESUME_TOKEN_REGS:
                    await bench.write_reg(n, 0)
                for n, w in zip(RESUME_TOKEN_REGS, tokens, strict=True):
                    await bench.write_reg(n, w)
                continue
            break
        if profiler is not None:
            profiler.cancel()
            res["pc_cycles"] = {str(k): v for k, v in pcs.items()}
        res["status"] = Status(st).name
        res["error_code"] = await bench.read_reg("ERROR_CODE")
        res["error_pc"] = await bench.read_reg("ERROR_PC")
        res["fault_addr"] = await bench.read_reg("FAULT_ADDR")
        res["counters"] = total
        res["wall_s"] = time.perf_counter() - t_job
        res["run_wall_s"] = run_wall
        (jobs_path / f"{job['name']}.dram").write_bytes(bench.ram.read(0, window))
        results.append(res)
        await bench.write_reg("CONTROL", int(Control.SOFT_RESET))
        await ClockCycles(dut.clk, 2)
    (jobs_path / "results.json").write_text(json.dumps(results))
