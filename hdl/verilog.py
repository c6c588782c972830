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
