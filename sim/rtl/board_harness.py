"""The board tops' cocotb harness shared by cocotb_board.py and cocotb_board_bench.py: the clock,
the SDRAM model (ULX3S), reset, and a host thread whose serial byte stream is moved to and from
cocotbext-uart's source and sink on the top's `rx` / `tx` pins while it runs."""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Callable

from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Timer
from cocotbext.uart import UartSink, UartSource

from npu.sim.rtl.cocotb_bridge import QueueStream

CLOCK_MHZ = float(os.environ.get("BOARD_CLOCK_MHZ", 50))
DIVISOR = int(os.environ["BOARD_DIVISOR"])  # the top's SIM_DIVISOR
PERIOD_PS = 2 * round(1e6 / CLOCK_MHZ / 2)


async def start_board(dut):
    """Clock the top, start the SDRAM model when the board has one (`BOARD_DRAM`), reset it; the
    SDRAM model or None."""
    import cocotb

    cocotb.start_soon(Clock(dut.clk, PERIOD_PS, unit="ps").start())
    sdram = None
    if os.environ.get("BOARD_DRAM") == "sdram":
        from npu.hdl.mem.sdram import SdramTiming
        from npu.sim.rtl.sdram_model import SdramModel

        sdram = SdramModel(dut, dut.clk, timing=SdramTiming(), clock_mhz=CLOCK_MHZ, read_delay=-1)
        sdram.start()
    dut.rx.value = 1
    dut.rst.value = 1
    await ClockCycles(dut.clk, 8)
    dut.rst.value = 0
    return sdram


async def run_host(
    dut, host: Callable[[QueueStream], None], say: Callable[[str], None], step: int = 64
) -> int:
    """Run `host(stream)` in a thread while moving its bytes over the UART, a wake-up every `step`
    cycles (not one per clock edge); its exception, if any, is raised here. The cycles simulated."""
    baud = CLOCK_MHZ * 1e6 / DIVISOR
    src, sink = UartSource(dut.rx, baud=baud), UartSink(dut.tx, baud=baud)
    stream, errors = QueueStream(), []

    def run():
        try:
            host(stream)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    th = threading.Thread(target=run, name="host", daemon=True)
    th.start()
    cycles, moved = 0, 0
    while th.is_alive():
        await Timer(step * PERIOD_PS, unit="ps")
        cycles += step
        if cycles % (1 << 22) == 0:
            say(
                f"{cycles:,} cycles, {moved} bytes from the board, running {dut.running.value}, "
                f"error {dut.error.value}"
            )
            if os.environ.get("BOARD_DEBUG"):
                import traceback

                frame = sys._current_frames().get(th.ident)
                say(
                    "host at: "
                    + " <- ".join(f"{f.name}:{f.lineno}" for f in traceback.extract_stack(frame)[-6:])
                )
        while True:
            try:
                src.write_nowait(stream.to_dev.get_nowait())
            except queue.Empty:
                break
        data = sink.read_nowait()
        if data:
            moved += len(data)
            stream.from_dev.put(bytes(data))
    if errors:
        raise errors[0]
    return cycles
