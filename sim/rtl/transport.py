"""The RTL backend: the Amaranth core in a cocotb simulation (Verilator by default, `SIM=icarus`).

cocotb owns the simulator process, so driver code runs inside it: `run_on_rtl(fn, *args)` builds the
simulation top (core + in-simulator DRAM), starts the simulator and calls `fn(transport, *args)` in
a thread bridged into the simulation with cocotb's `bridge`; every transport call hops back into the
simulation with `resume`. The driver code is the same synchronous code the model backend runs.
Results come back pickled.

A configuration of several engines (`cfg.engines > 1`: `duo`, or `get_config("tiny").replace(engines=2)`)
runs on the SoC (hdl/soc.py) with the same in-simulator DRAM, as the SoC bench builds it; the transport
(`SocRtlTransport`) then takes SoC register offsets (the SoC block at 0, engine i's window at
`engine_window(i)`), as `SocModelTransport` does, so `Npu(transport=..., config=cfg)` drives every engine.

    from npu.sim.rtl.transport import run_on_rtl
    def job(transport):
        npu = Npu(transport=transport, config="tiny")
        ...
        return figures
    figures = run_on_rtl(job, config="tiny")
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path

from npu.config import NpuConfig, get_config
from npu.driver.transport import Transport, TransportError
from npu.registers import REG, Control, Status, engine_window, window_of

DEFAULT_DRAM = 2 << 20


class RtlTransport(Transport):
    """Register, DRAM and time access to the simulated core, usable from a bridged thread."""

    def __init__(self, bench, dram_bytes: int):
        from cocotb.task import resume

        self.bench, self.cfg, self.dram_bytes = bench, bench.cfg, dram_bytes
        self.dut = bench.dut
        self._rd = resume(bench.regs.read_dword)
        self._wr = resume(bench.regs.write_dword)
        self._mem_rd = resume(self._mem_read)
        self._mem_wr = resume(self._mem_write)
        self._wait = resume(self._wait_async)

    async def _mem_read(self, addr: int, n: int) -> bytes:
        return self.bench.ram.read(addr, n)

    async def _mem_write(self, addr: int, data: bytes) -> None:
        self.bench.ram.write(addr, data)

    def _check(self, addr: int, n: int) -> None:
        if addr < 0 or addr + n > self.dram_bytes:
            raise TransportError(f"DRAM access 0x{addr:x}+{n} outside the simulated {self.dram_bytes} bytes")

    def read_reg(self, offset: int) -> int:
        return int(self._rd(offset))

    def write_reg(self, offset: int, value: int) -> None:
        self._wr(offset, value)

    def read_dram(self, addr: int, n: int) -> bytes:
        self._check(addr, n)
        return self._mem_rd(addr, n)

    def write_dram(self, addr: int, data: bytes) -> None:
        self._check(addr, len(data))
        self._mem_wr(addr, bytes(data))

    async def _wait_async(self, max_cycles: int | None) -> int:
        from cocotb.triggers import First, RisingEdge

        from .cycles import Cycles

        t0 = self.now()
        clk = self.dut.clk
        running = Status(await self.bench.regs.read_dword(0x10)) == Status.RUNNING
        if not running:
            if max_cycles:
                await Cycles(clk, max_cycles)
            return self.now() - t0
        if self.dut.irq.value != 1:
            if max_cycles is None:
                await RisingEdge(self.dut.irq)
            else:
                await First(RisingEdge(self.dut.irq), Cycles(clk, max_cycles))
        return self.now() - t0

    def wait(self, max_cycles: int | None) -> int:
        return self._wait(max_cycles)

    def now(self) -> int:
        from cocotb.utils import get_sim_time

        return int(get_sim_time(unit="ns")) // 10


class SocRtlTransport(RtlTransport):
    """The SoC in simulation: registers at SoC offsets (the SoC block, then one window per engine),
    the shared DRAM, and `wait` until an engine that was running stops."""

    #: cycles between STATUS reads of a running engine whose interrupt line is already raised (an
    #: uncleared IRQ.PENDING hides its stop; the driver clears it before every start)
    POLL_CYCLES = 256

    def __init__(self, bench, dram_bytes: int):
        super().__init__(bench, dram_bytes)
        #: engines the host last saw running (a STATUS read, or a START written since): a stop of
        #: one of them that happened while the host was busy elsewhere ends the next `wait` at once
        self._seen_running: set[int] = set()

    def _note(self, engine: int, status: int) -> None:
        if status == Status.RUNNING:
            self._seen_running.add(engine)
        else:
            self._seen_running.discard(engine)

    def read_reg(self, offset: int) -> int:
        value = super().read_reg(offset)
        e, rel = window_of(offset)
        if 0 <= e < self.cfg.engines and rel == REG["STATUS"].offset:
            self._note(e, value)
        return value

    def write_reg(self, offset: int, value: int) -> None:
        super().write_reg(offset, value)
        e, rel = window_of(offset)
        if not 0 <= e < self.cfg.engines:
            return
        if rel == REG["CONTROL"].offset and value & (Control.START | Control.SOFT_RESET):
            self._note(e, Status.RUNNING if not value & Control.SOFT_RESET else Status.IDLE)
        elif rel == REG["RING_TAIL"].offset:  # the doorbell: a waiting engine runs again
            self._note(e, Status.RUNNING)

    async def _status_of(self, engine: int) -> int:
        value = await self.bench.regs.read_dword(engine_window(engine) + REG["STATUS"].offset)
        self._note(engine, value)
        return value

    async def _wait_async(self, max_cycles: int | None) -> int:
        """Watch the per-engine interrupt lines (`irqs`), not the combined `irq`: other engines'
        interrupts may be pending and uncleared. Engines are running if STATUS says so when `wait`
        is called (one register read per engine); one the host last saw running that has stopped
        meanwhile ends the wait at once."""
        from cocotb.triggers import First, ValueChange

        from .cycles import Cycles

        t0 = self.now()
        deadline = None if max_cycles is None else t0 + max_cycles
        clk, irqs = self.dut.clk, self.dut.irqs
        n = self.cfg.engines
        seen = set(self._seen_running)
        running = [e for e in range(n) if Status(await self._status_of(e)) == Status.RUNNING]
        if seen - set(running):
            # an engine the host last saw running has stopped since (while the host served another,
            # or during the reads above): that is a stop it is waiting for
            return self.now() - t0
        if not running:
            if max_cycles and self.now() < deadline:
                await Cycles(clk, deadline - self.now())
            return self.now() - t0
        # a running engine whose line is up already either stopped since its STATUS read, or has a
        # stale IRQ.PENDING: read again, and poll the stale ones
        watch, stale = 0, []
        lines = int(irqs.value)
        for e in running:
            if (lines >> e) & 1:
                if Status(await self._status_of(e)) != Status.RUNNING:
                    return self.now() - t0
                stale.append(e)
            else:
                watch |= 1 << e
        while True:
            # a line may rise during a register read: no change would trigger then (the engine stays
            # noted as running: a FENCE raises its line too, and the host's STATUS read tells)
            if int(irqs.value) & watch:
                break
            left = None if deadline is None else deadline - self.now()
            if left is not None and left <= 0:
                break
            step = left
            if stale:
                step = self.POLL_CYCLES if left is None else min(left, self.POLL_CYCLES)
            triggers = [ValueChange(irqs)] if watch else []
            if step is not None:
                triggers.append(Cycles(clk, step))
            await (First(*triggers) if len(triggers) > 1 else triggers[0])
            if stale and (left is None or self.now() < deadline):
                for e in stale:
                    if Status(await self._status_of(e)) != Status.RUNNING:
                        return self.now() - t0
        return self.now() - t0


def _entry_spec() -> dict:
    return pickle.loads((Path(os.environ["NPU_DRIVER_JOB"]) / "job.pkl").read_bytes())


def run_on_rtl(
    fn: Callable | str,
    *args,
    config: str | NpuConfig = "default",
    dram_bytes: int = DEFAULT_DRAM,
    waves: bool = False,
):
    """Run `fn(transport, *args)` against the RTL core (or, for a configuration of several engines,
    the SoC) and return its result. `fn` must be importable (a module-level function, or
    "module:function")."""
    import sys

    from npu.hdl.verilog import sim_top_verilog
    from npu.sim.rtl.core import sim_dram_bytes
    from npu.sim.rtl.hdlsim import BUILD, build_and_test

    cfg = get_config(config)
    soc = cfg.engines > 1
    # the core addresses no more than its configuration's DRAM; the RAM is the configuration's (see
    # sim_dram_bytes), so these runs share the simulator build of the preset's RTL suite
    dram_bytes = min(dram_bytes, cfg.dram_bytes)
    ram_bytes = sim_dram_bytes(cfg, dram_bytes)
    target = fn if isinstance(fn, str) else f"{fn.__module__}:{fn.__qualname__}"
    what = f"{cfg.engines}-engine SoC of {cfg.engine.name}" if soc else f"{cfg.name} core"
    print(
        f"RTL simulation of the {what} (the first run generates Verilog and builds the simulator, "
        "a few minutes; later runs reuse it)",
        file=sys.stderr,
        flush=True,
    )
    if soc:  # the SoC bench's top with the in-simulator DRAM (npu.sim.rtl.soc.run_soc_rtl, fast_dram)
        verilog, name = sim_top_verilog(cfg, ram_bytes, soc=True), f"soctop-{cfg.engines}x{cfg.engine.name}"
    else:
        verilog, name = sim_top_verilog(cfg, ram_bytes), f"simtop-{cfg.name}"
    BUILD.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BUILD, prefix="driver-") as tmp:
        d = Path(tmp)
        # the configuration itself: one of several engines need not be a named preset
        (d / "job.pkl").write_bytes(pickle.dumps({"config": cfg, "fn": target, "args": args,
                                                   "dram_bytes": dram_bytes}))  # fmt: skip
        try:
            build_and_test(
                verilog,
                "npu_sim_top",
                "npu.sim.rtl.transport_entry",
                name=name,
                extra_env={"NPU_DRIVER_JOB": str(d)},
                waves=waves,
                quiet=True,
            )
        except (AssertionError, SystemExit):
            pass  # the job's own exception, if any, is in result.pkl (under pytest, cocotb's runner
            # reports a failed cocotb test with SystemExit)
        res_path = d / "result.pkl"
        if not res_path.exists():
            raise TransportError("the RTL simulation ended without a result (see sim.log in build/sim/)")
        ok, value = pickle.loads(res_path.read_bytes())
        if not ok:
            raise value
        return value
