"""cocotb test module behind `npu.sim.rtl.transport.run_on_rtl`: reset the simulated core (or SoC), then run
the requested driver function in a bridged thread and pickle its result (or its exception)."""

from __future__ import annotations

import os
import pickle
import traceback
from pathlib import Path

import cocotb
from cocotb.task import bridge

from npu.driver.resolve import resolve
from npu.sim.rtl.cocotb_bench import NpuBench
from npu.sim.rtl.transport import RtlTransport, SocRtlTransport, _entry_spec


@cocotb.test()
async def run_driver_job(dut):
    spec = _entry_spec()
    out = Path(os.environ["NPU_DRIVER_JOB"]) / "result.pkl"
    bench = NpuBench(dut, spec["config"], spec["dram_bytes"])
    await bench.reset()
    # the SoC top (several engines) carries the same in-simulator DRAM, reached the same way
    kind = SocRtlTransport if bench.cfg.engines > 1 else RtlTransport
    transport = kind(bench, spec["dram_bytes"])
    fn = resolve(spec["fn"])
    try:
        value = await bridge(fn)(transport, *spec["args"])
        out.write_bytes(pickle.dumps((True, value)))
    except Exception as e:  # handed back to the caller of run_on_rtl
        try:
            out.write_bytes(pickle.dumps((False, e)))
        except Exception:
            out.write_bytes(pickle.dumps((False, RuntimeError(traceback.format_exc()))))
        raise
