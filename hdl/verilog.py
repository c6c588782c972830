"""Verilog generation for `NpuCore` (`npu hdl verilog --config tiny -o npu.v`): the only place the
interfaces become flat `m_axi_*` / `s_axil_*` ports."""

from __future__ import annotations

from amaranth.back import verilog

from npu.config import NpuConfig, get_config

from .axi import FlatPorts
from .core import NpuCore

TOPLEVEL = "npu_core"
SOC_TOPLEVEL = "npu_soc"
#: flat port names of the Verilog tops, as cocotbext-axi's `from_prefix` and board tops expect
PREFIXES = {"bus": "m_axi", "ctrl": "s_axil"}


def core_verilog(config: NpuConfig | str) -> str:
    cfg = get_config(config)
    return verilog.convert(FlatPorts(NpuCore(cfg), PREFIXES), name=TOPLEVEL, emit_src=False)


def soc_verilog(config: NpuConfig | str) -> str:
    """Verilog of the SoC (`config.engines` engines, hdl/soc.py), top module `npu_soc`."""
    from .soc import NpuSoc

    return verilog.convert(FlatPorts(NpuSoc(get_config(config)), PREFIXES), name=SOC_TOPLEVEL, emit_src=False)


def sim_top_verilog(config: NpuConfig | str, dram_size: int, stalls: bool = False, soc: bool = False) -> str:
    """The core (or the SoC) with the simulation-only in-simulator DRAM (hdl/simdram.py),
    optionally stalling every AXI channel at random."""
    from .simdram import NpuSimTop

    top = FlatPorts(NpuSimTop(get_config(config), dram_size, stalls, soc), PREFIXES)
    return verilog.convert(top, name="npu_sim_top", emit_src=False)
