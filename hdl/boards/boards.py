"""The boards `npu build` knows: platform, part, preset, DRAM, clocks and the UART's baud rate."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace

from npu.config import ConfigError, NpuConfig, get_config

from .dsp_sites import ECP5_85F, DspGrid


@dataclass(frozen=True)
class Board:
    name: str
    #: "module:Class" of the amaranth-boards platform
    platform_class: str
    device: str
    family: str  # "ecp5" or "ice40"
    #: the `npu config` preset this board builds by default
    preset: str
    #: default core clock (MHz), made by the PLL from the board's oscillator
    clock_mhz: float
    osc_mhz: float
    osc: str  # the oscillator's resource name
    dram: str  # "sdram" (SDR SDRAM through hdl/mem/sdram.py) or "spram" (hdl/mem/spram.py)
    dram_bytes: int
    baud: int
    #: the reset button's resource name
    reset_button: str
    #: report names -> nextpnr bel types
    resource_bels: dict[str, str] = field(default_factory=dict)
    nextpnr_opts: str = ""
    #: nextpnr's placement seed of a single build (`--seeds N` tries 1..N)
    seed: int = 1
    synth_opts: str = ""
    #: the device's resources, keyed as resource_bels (what a design must fit: `npu dse`)
    capacity: dict[str, int] = field(default_factory=dict)
    #: how openFPGALoader names the board
    loader_board: str = ""
    #: the part's multiplier sites, for fixing the matrix unit's (hdl/boards/dsp_sites.py); None: none
    dsp_grid: DspGrid | None = None

    def config(self, name: str | None = None, engines: int | None = None) -> NpuConfig:
        """The preset `name` (default: the board's own), with `engines` if given, refused when it
        addresses more DRAM than the board has."""
        cfg = get_config(name or self.preset)
        if engines is not None:
            cfg = cfg.replace(engines=engines)
        if cfg.dram_bytes > self.dram_bytes:
            raise ConfigError(
                f"config {cfg.name!r} addresses {cfg.dram_bytes} bytes of DRAM "
                f"but {self.name} has {self.dram_bytes}"
            )
        return cfg

    def with_pnr(self, placer: str | None = None, router: str | None = None) -> Board:
        """This board with nextpnr's placer and/or router replaced (`npu build --placer/--router`);
        the board's own where None."""
        opts = self.nextpnr_opts.split()
        for flag, value in (("--placer", placer), ("--router", router)):
            if value is None:
                continue
            if flag in opts:
                i = opts.index(flag)
                del opts[i : i + 2]
            opts += [flag, value]
        return replace(self, nextpnr_opts=" ".join(opts))

    def pnr(self) -> dict[str, str]:
        """The placer and router this board's builds ask nextpnr for (nextpnr's defaults: heap,
        router1)."""
        opts = self.nextpnr_opts.split()
        get = lambda flag, default: opts[opts.index(flag) + 1] if flag in opts else default  # noqa: E731
        return {"placer": get("--placer", "heap"), "router": get("--router", "router1")}

    def platform(self):
        try:
            module, cls = self.platform_class.split(":")
            return getattr(importlib.import_module(module), cls)()
        except ImportError as e:
            raise RuntimeError(
                f"board {self.name}: amaranth-boards is not installed ({e}); "
                '`pip install -e ".[fpga]"` (the README\'s set-up does)'
            ) from e


BOARDS: dict[str, Board] = {
    "ulx3s": Board(
        name="ulx3s",
        platform_class="amaranth_boards.ulx3s:ULX3S_85F_Platform",
        device="LFE5U-85F-6BG381C",
        family="ecp5",
        # 32 MACs: with the bands' pitch off the banks' period (docs/compiler.md) faster per
        # inference than the 16-MAC `ulx3s` on the tinyML CNNs, and meets 50 MHz (docs/boards.md)
        preset="ulx3s32",
        clock_mhz=50.0,
        osc_mhz=25.0,
        osc="clk25",
        dram="sdram",
        dram_bytes=32 * 1024 * 1024,
        baud=115200,
        reset_button="button_fire",
        resource_bels={
            "lut": "TRELLIS_COMB",
            "ff": "TRELLIS_FF",
            "bram": "DP16KD",
            "dsp": "MULT18X18D",
            "lutram": "TRELLIS_RAMW",
        },  # fmt: skip
        capacity={"lut": 83_640, "ff": 83_640, "bram": 208, "dsp": 156, "lutram": 10_455},
        # HeAP placement and router1 meet 50 MHz with the memory window (52.15 MHz, 37.5 minutes);
        # the static placer with router2 routes in about 11 minutes but at 41-48 MHz (docs/boards.md)
        nextpnr_opts="--placer heap --router router1",
        # a seed is a property of one netlist: with RESUME_TOKENS seed 1's router diverged and seed
        # 2 met timing; with the pause hold seed 2's diverged and seeds 1 (52.22 MHz) and 3 met it
        # (docs/boards.md). `--seeds N` stops the others once one meets timing
        seed=1,
        loader_board="ulx3s",
        dsp_grid=ECP5_85F,
    ),
    "icebreaker": Board(
        name="icebreaker",
        platform_class="amaranth_boards.icebreaker:ICEBreakerPlatform",
        device="iCE40UP5K-SG48",
        family="ice40",
        preset="icebreaker",
        clock_mhz=12.0,
        osc_mhz=12.0,
        osc="clk12",
        dram="spram",
        dram_bytes=128 * 1024,
        baud=115200,
        reset_button="button",
        resource_bels={
            "lc": "ICESTORM_LC",
            "bram": "ICESTORM_RAM",
            "dsp": "ICESTORM_DSP",
            "spram": "ICESTORM_SPRAM",
        },  # fmt: skip
        capacity={"lc": 5_280, "bram": 30, "dsp": 8, "spram": 4},
        synth_opts="-dsp",
        loader_board="ice40_generic",
    ),
}


def get_board(name: str) -> Board:
    if name not in BOARDS:
        raise KeyError(f"unknown board {name!r}; known boards: {', '.join(BOARDS)}")
    return BOARDS[name]
