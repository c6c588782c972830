"""The engine a configuration asks for: `NpuCore` (`core="pipelined"`) or `MicroCore` (`"micro"`),
and the Verilog sources beyond Amaranth's output that it needs."""

from __future__ import annotations

from amaranth.lib import wiring

from npu.config import NpuConfig


def engine_core(cfg: NpuConfig, flash_boot: bool = False) -> wiring.Component:
    """One engine of `cfg` (AXI4 `bus`, AXI4-Lite `ctrl`, `irq`). `flash_boot`: a micro core's
    firmware is not preloaded into its simulated RAM but read from its `flash` pins."""
    if cfg.core == "micro":
        from .micro.core import MicroCore

        return MicroCore(cfg, preload=False if flash_boot else None)
    from .core import NpuCore

    return NpuCore(cfg)


def extra_verilog(cfg: NpuConfig) -> str:
    """Verilog the engine instantiates (the micro core's PicoRV32), to append to Amaranth's output."""
    if cfg.core == "micro":
        from .micro.cpu import picorv32_source

        return "\n" + picorv32_source()
    return ""
