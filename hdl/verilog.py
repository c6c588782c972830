"""Verilog generation for `NpuCore` (`npu hdl verilog --config tiny -o npu.v`)."""

from __future__ import annotations

from amaranth.back import verilog

from npu.config import NpuConfig, get_config

from .core import NpuCore

TOPLEVEL = "npu_core"


def core_verilog(config: NpuConfig | str) -> str:
    cfg = get_config(config)
    core = NpuCore(cfg)
    return verilog.convert(core, name=TOPLEVEL, emit_src=False)


def sim_top_verilog(config: NpuConfig | str, dram_size: int) -> str:
    """The core with the simulation-only in-simulator DRAM (hdl/simdram.py)."""
    from .simdram import NpuSimTop

    return verilog.convert(NpuSimTop(get_config(config), dram_size), name="npu_sim_top", emit_src=False)
