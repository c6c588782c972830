"""cocotb: a board's top (`BoardCore` with the vendor primitives swapped for simulation models)
driven by the host's unchanged driver over the UART.

The host runs in a thread: `Npu` over `SerialTransport`, whose byte stream a coroutine moves to
and from cocotbext-uart's `UartSource` / `UartSink` on the top's `rx` / `tx` pins. On the ULX3S top
the SDRAM pins go to the SDRAM model with its timing checks on (a violation fails the test). The
host loads two compiled zoo models, runs each alone, then the low-priority one again, paused at its
first cancellation point (the core dumps its live data) and resumed, and compares every output with
the golden model's, computed beforehand by the pytest side (`BOARD_CASE`, an .npz file).
"""

from __future__ import annotations

import os
import sys
import time

import cocotb
import numpy as np

from npu.sim.rtl.board_harness import run_host, start_board
from npu.sim.rtl.cocotb_bridge import QueueStream


def say(msg: str) -> None:
    print(f"[board {time.monotonic() - T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


T0 = time.monotonic()


def host(stream: QueueStream, out: dict) -> None:
    from npu.config import get_config
    from npu.container import Container
    from npu.driver.runtime import Npu, Priority
    from npu.driver.serial import SerialTransport

    case = np.load(os.environ["BOARD_CASE"])
    cfg = get_config(os.environ["BOARD_CONFIG"])
    # a short timeout: a request lost on the link costs seconds of wall time, not minutes
    tr = SerialTransport(cfg, stream=stream, timeout_s=float(os.environ.get("BOARD_TIMEOUT", 5)), retries=4)
    try:
        npu = Npu(transport=tr, config=cfg)
        npu.wait_quantum = 2000  # each WAIT short, so a submission from this thread is seen soon
        say("connected")
        low = npu.load(Container.load(os.environ["BOARD_LOW"]), "low")
        urgent = npu.load(Container.load(os.environ["BOARD_URGENT"]), "urgent")
        say("models loaded")
        alone = low.run(case["x_low"], int8=True)
        say("low-priority model run alone")
        out["urgent"] = urgent.submit(case["x_urgent"], priority=Priority.HIGH, int8=True).result()
        say("urgent model run alone")
        # paused at its first cancellation point (its live data dumped), then resumed
        job = low.submit(case["x_low"], priority=Priority.LOW, int8=True)
        npu.run_until(lambda: job.state == "running" or job.done())
        npu.pause(job)
        npu.run_until(lambda: job.state == "paused" or job.done())
        out["paused"] = job.state == "paused"
        npu.resume(job)
        out["low"] = job.result()
        out["preemptions"] = len(job.preemptions)
        say(f"low-priority model paused, resumed and done ({out['preemptions']} preemption)")
        out["alone"] = alone
        out["stats"] = tr.stats
    finally:
        tr.close()


@cocotb.test()
async def model_with_preemption(dut):
    sdram = await start_board(dut)
    out: dict = {}
    await run_host(dut, lambda stream: host(stream, out), say)
    case = np.load(os.environ["BOARD_CASE"])
    for name in ("alone", "low"):
        for k, (a, b) in enumerate(
            zip(out[name], [case[f"ref_low{i}"] for i in range(len(out[name]))], strict=True)
        ):
            assert np.array_equal(a, b), f"{name}: output {k} differs from the golden model"
    for k, a in enumerate(out["urgent"]):
        assert np.array_equal(a, case[f"ref_urgent{k}"]), f"urgent: output {k} differs from the golden model"
    assert out["paused"] and out["preemptions"] == 1, (out["paused"], out["preemptions"])
    if sdram is not None:
        sdram.check()
        dut._log.warning(f"SDRAM: {sdram.commands}, refreshes {sdram.refresh_stats()}")
    dut._log.warning(f"board run: {out['preemptions']} preemption(s), link {out['stats']}")
