"""Verilog generation for `NpuCore` (`npu hdl verilog --config tiny -o npu.v`): the only place the
interfaces become flat `m_axi_*` / `s_axil_*` ports."""

from __future__ import annotations

from amaranth.back import verilog

from npu.config import NpuConfig, get_config

from .axi import FlatPorts
from .engine import engine_core, extra_verilog

TOPLEVEL = "npu_core"
SOC_TOPLEVEL = "npu_soc"
#: flat port names of the Verilog tops, as cocotbext-axi's `from_prefix` and board tops expect
PREFIXES = {"bus": "m_axi", "ctrl": "s_axil"}


def _convert(top, name: str, cfg: NpuConfig) -> str:
    """Amaranth's Verilog of `top`, with the sources its engines instantiate (`cfg`'s engine)."""
    return verilog.convert(top, name=name, emit_src=False) + extra_verilog(cfg.engine)


def core_verilog(config: NpuConfig | str) -> str:
    cfg = get_config(config)
    return _convert(FlatPorts(engine_core(cfg), PREFIXES), TOPLEVEL, cfg)


def soc_verilog(config: NpuConfig | str) -> str:
    """Verilog of the SoC (`config.engines` engines, hdl/soc.py), top module `npu_soc`."""
    from .soc import NpuSoc

    cfg = get_config(config)
    return _convert(FlatPorts(NpuSoc(cfg), PREFIXES), SOC_TOPLEVEL, cfg)


def sim_top_verilog(config: NpuConfig | str, dram_size: int, stalls: bool = False, soc: bool = False) -> str:
    """The core (or the SoC) with the simulation-only in-simulator DRAM (hdl/simdram.py),
    optionally stalling every AXI channel at random."""
    from .simdram import NpuSimTop

    cfg = get_config(config)
    return _convert(FlatPorts(NpuSimTop(cfg, dram_size, stalls, soc), PREFIXES), "npu_sim_top", cfg)


def board_sim_verilog(board, cfg: NpuConfig) -> str:
    """The board's system (`BoardCore` with simulation models, hdl/boards/top.py) as Verilog, top
    module `board_top`; the SDRAM's pins come out as `sdram_*`."""
    from .boards.top import BoardCore

    top = FlatPorts(BoardCore(board, cfg, board.clock_mhz, sim=True), {"sdram": "sdram"})
    return _convert(top, "board_top", cfg)
