"""cocotb: per-inference cycles of compiled models on a board's simulated top (`npu bench board`).

The host's unchanged driver (`Npu` over `SerialTransport`) talks to `BoardCore` over the UART, as
in cocotb_board.py. On an SDRAM board the model images are written into the SDRAM model's cells
directly (a back door: a 200 KB model would take millions of cycles of the simulated link), and
everything else - the registers, the job's start, its WAIT polling, the outputs - crosses the serial
bridge. Probe programs (`BOARD_PROGRAMS`, raw instruction words) run first, each alone from the
driver's area, for their CYCLES; then each model runs once. The job's performance counters (CYCLES:
the core's cycles of the run) go to `BOARD_RESULT` (JSON), the outputs to `BOARD_RESULT`.npz.
"""

from __future__ import annotations

import json
import os
import sys
import time

import cocotb
import numpy as np

from npu.sim.rtl.board_harness import run_host, start_board
from npu.sim.rtl.cocotb_bridge import QueueStream

T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[board bench {time.monotonic() - T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


def sdram_backdoor(transport, sdram) -> None:
    """Route `transport`'s DRAM writes into the SDRAM model's cells (the controller's address map;
    16-bit words, the low byte first)."""
    g = sdram.g

    def write_dram(addr: int, data: bytes) -> None:
        data = bytes(data)
        if addr % 2:  # keep the neighbouring byte of an odd start
            data = transport.read_dram(addr - 1, 1) + data
            addr -= 1
        if len(data) % 2:
            data += transport.read_dram(addr + len(data), 1)
        for k in range(0, len(data), 2):
            sdram.mem[g.split((addr + k) // 2)] = data[k] | data[k + 1] << 8

    transport.write_dram = write_dram


def host(stream: QueueStream, sdram, out: dict) -> None:
    from npu.config import get_config
    from npu.container import Container
    from npu.driver.runtime import Npu
    from npu.driver.serial import SerialTransport

    cfg = get_config(os.environ["BOARD_CONFIG"])
    inputs = np.load(os.environ["BOARD_INPUTS"])
    tr = SerialTransport(cfg, stream=stream, timeout_s=float(os.environ.get("BOARD_TIMEOUT", 10)), retries=4)
    if sdram is not None:
        sdram_backdoor(tr, sdram)
    try:
        npu = Npu(transport=tr, config=cfg)
        npu.wait_quantum = 1 << 16  # a long run polls rarely (the link's time is not the core's)
        say("connected")
        progs = os.environ.get("BOARD_PROGRAMS")
        for path in progs.split(os.pathsep) if progs else []:
            with open(path, "rb") as f:
                st = npu.run_raw(f.read(), max_cycles=1 << 26)
            out["probes"].append({"status": st.name, "cycles": int(npu.counters()["CYCLES"])})
        if progs:
            say(f"{len(out['probes'])} probe programs run")
        models = os.environ.get("BOARD_MODELS")
        for k, path in enumerate(models.split(os.pathsep) if models else []):
            model = npu.load(Container.load(path), f"m{k}")
            say(f"model {k} loaded")
            job = model.submit(inputs[f"x{k}"], int8=True)
            outputs = job.result()
            out["rows"].append({"cycles": int(job.counters["CYCLES"]), "counters": dict(job.counters)})
            out["outputs"].update({f"y{k}_{i}": y for i, y in enumerate(outputs)})
            say(f"model {k}: {job.counters['CYCLES']:,} cycles")
            model.unload()
    finally:
        tr.close()


@cocotb.test()
async def models_per_inference(dut):
    sdram = await start_board(dut)
    out: dict = {"rows": [], "outputs": {}, "probes": []}
    cycles = await run_host(dut, lambda stream: host(stream, sdram, out), say)
    if sdram is not None:
        sdram.check()
    result = os.environ["BOARD_RESULT"]
    np.savez(result + ".npz", **out["outputs"])
    with open(result, "w") as f:
        json.dump(
            {
                "rows": out["rows"],
                "probes": out["probes"],
                "simulated_cycles": cycles,
                "seconds": time.monotonic() - T0,
            },
            f,
        )
