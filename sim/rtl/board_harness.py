"""The board tops' cocotb harness shared by cocotb_board.py and cocotb_board_bench.py: the clock,
the SDRAM model (ULX3S), reset, and a host thread whose serial byte stream is moved to and from
cocotbext-uart's source and sink on the top's `rx` / `tx` pins while it runs."""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Callable

from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Timer
from cocotbext.uart import UartSink, UartSource

from npu.sim.rtl.cocotb_bridge import QueueStream

CLOCK_MHZ = float(os.environ.get("BOARD_CLOCK_MHZ", 50))
DIVISOR = int(os.environ["BOARD_DIVISOR"])  # the top's SIM_DIVISOR
PERIOD_PS = 2 * round(1e6 / CLOCK_MHZ / 2)
#: the longest the simulated clock waits for the host's next request (wall seconds): a host that
#: waits for the board's time to pass without asking (none of ours) only runs slower
HOST_STALL_S = 30.0


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
    cycles (not one per clock edge), in lock-step: after each whole reply the clock waits for the
    host's next request. Its exception, if any, is raised here. The cycles simulated."""
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

    def next_request() -> None:
        """Lock-step: the simulated clock stands while the host thinks, until its next request
        (or its end), so the bytes reach the board at a cycle set by the board alone, never by how
        fast this machine runs the host thread (which moved the cycles of a run by a few)."""
        deadline = time.monotonic() + HOST_STALL_S
        while th.is_alive() and time.monotonic() < deadline:
            try:
                src.write_nowait(stream.to_dev.get(timeout=0.01))
                return
            except queue.Empty:
                pass

    next_request()  # the first request (HELLO) at a fixed cycle too
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
            if data[-1] == 0 and stream.to_dev.empty():  # a whole frame (COBS delimiter) delivered
                next_request()
    if errors:
        raise errors[0]
    return cycles
