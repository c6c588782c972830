"""Verilog generation for `NpuCore` (`npu hdl verilog --config tiny -o npu.v`): the only place the
interfaces become flat `m_axi_*` / `s_axil_*` ports."""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from amaranth.back import verilog

from npu.config import NpuConfig, get_config
from npu.files import write_atomic

from .axi import FlatPorts
from .engine import engine_core, extra_verilog

TOPLEVEL = "npu_core"
SOC_TOPLEVEL = "npu_soc"
#: flat port names of the Verilog tops, as cocotbext-axi's `from_prefix` and board tops expect
PREFIXES = {"bus": "m_axi", "ctrl": "s_axil"}


def _convert(top, name: str, cfg: NpuConfig) -> str:
    """Amaranth's Verilog of `top`, with the sources its engines instantiate (`cfg`'s engine)."""
    return verilog.convert(top, name=name, emit_src=False) + extra_verilog(cfg.engine)


@functools.cache
def _sources_digest() -> str:
    """A digest of everything the Verilog depends on: the RTL and contract sources, the firmware
    image and the versions of Amaranth and of the PicoRV32 sources."""
    import npu.config  # the contracts, wherever they are installed

    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for f in sorted(here.rglob("*")):
        if f.suffix in (".py", ".bin", ".c", ".h", ".S", ".ld") and "__pycache__" not in f.parts:
            h.update(f.relative_to(here).as_posix().encode() + b"\0" + f.read_bytes())
    for f in sorted(Path(npu.config.__file__).parent.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    for dist in ("amaranth", "amaranth-boards", "pythondata-cpu-picorv32"):
        try:
            h.update(f"{dist}=={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            pass
    return h.hexdigest()


def _cache_dir() -> Path:
    return Path(os.environ.get("NPU_CACHE", Path.home() / ".cache" / "npu")) / "verilog"


def _cached(key: str, make: Callable[[], str]) -> str:
    """Elaborating and converting a core takes seconds: the Verilog is kept on disk under a digest
    of `key` and the sources (`NPU_CACHE`, default ~/.cache/npu), so every run after the first
    (each test worker, each simulation) reads it back."""
    digest = hashlib.sha256((_sources_digest() + key).encode()).hexdigest()[:24]
    path = _cache_dir() / f"{digest}.v"
    try:
        return path.read_text()
    except OSError:
        pass
    text = make()
    try:  # atomically: several workers may convert the same design at once
        write_atomic(path, text)
    except OSError:
        pass  # no cache (a read-only home): converted each time
    return text


def core_verilog(config: NpuConfig | str) -> str:
    cfg = get_config(config)
    return _cached(f"core {cfg!r}", lambda: _convert(FlatPorts(engine_core(cfg), PREFIXES), TOPLEVEL, cfg))


def soc_verilog(config: NpuConfig | str) -> str:
    """Verilog of the SoC (`config.engines` engines, hdl/soc.py), top module `npu_soc`."""
    from .soc import NpuSoc

    cfg = get_config(config)
    return _cached(f"soc {cfg!r}", lambda: _convert(FlatPorts(NpuSoc(cfg), PREFIXES), SOC_TOPLEVEL, cfg))


def sim_top_verilog(
    config: NpuConfig | str, dram_size: int, soc: bool = False, flash_boot: bool | bytes = False
) -> str:
    """The core (or the SoC) with the simulation-only in-simulator DRAM (hdl/simdram.py), which
    stalls every AXI channel at random while its `stall_en` port is high. `flash_boot`: a micro
    core reads its firmware from a model of the SPI flash (hdl/mem/spiflash.py) holding
    `flash_image()`, or these bytes at FLASH_FIRMWARE."""
    from .simdram import SIM_DRAM_VERILOG, NpuSimTop

    cfg = get_config(config)
    top = lambda: FlatPorts(NpuSimTop(cfg, dram_size, soc, flash_boot), PREFIXES)  # noqa: E731
    make = lambda: _convert(top(), "npu_sim_top", cfg) + SIM_DRAM_VERILOG  # noqa: E731
    flash = hashlib.sha256(flash_boot).hexdigest() if isinstance(flash_boot, bytes) else flash_boot
    return _cached(f"simtop {cfg!r} {dram_size} {soc} {flash}", make)


def board_sim_verilog(board, cfg: NpuConfig) -> str:
    """The board's system (`BoardCore` with simulation models, hdl/boards/top.py) as Verilog, top
    module `board_top`; the SDRAM's pins come out as `sdram_*`."""
    from .boards.top import BoardCore

    def make() -> str:
        ports = {"sdram": "sdram", "flash": "flash"}
        top = FlatPorts(BoardCore(board, cfg, board.clock_mhz, sim=True), ports)
        return _convert(top, "board_top", cfg)

    return _cached(f"board {board!r} {cfg!r}", make)
