"""Out-of-context timing of one unit of the core on an ECP5 part (`npu build --board B --unit U`).

A whole-core build says only that timing fails; this synthesises one unit alone (its ports left
unplaced, nextpnr's `--out-of-context`), places and routes it and reports its Fmax and critical path
with the source lines nextpnr names. The on-chip memories are measured with registers on every port
(`spad`, `acc`), since their paths start and end in the units that use them. Paths that cross units
(a unit's request through a memory's arbiter back to the unit) show in `core`: the whole core with
a register on each of its ports, without the board's DRAM controller and serial bridge, which
are units of their own (`sdram`, `bridge`: as the board top builds them, at the board's clock).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from amaranth import Module, Signal, Value
from amaranth.back import rtlil
from amaranth.hdl import Elaboratable

from npu.config import NpuConfig

from .boards import Board
from .build import BuildError, tool_env

UNITS = ("fetch", "load", "store", "matrix", "vector", "spad", "acc", "core", "sdram", "bridge")


class _Registered(Elaboratable):
    """`inner` with a register on every port, so its own paths run register to register."""

    def __init__(self, inner):
        self.inner = inner
        self.pairs = []
        for path, member, v in inner.signature.flatten(inner):
            v = Value.cast(v)
            self.pairs.append((member.flow.name, v, Signal(len(v), name="p_" + "_".join(map(str, path)))))
        self.ports = [o for _, _, o in self.pairs]

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = self.inner
        for flow, v, outer in self.pairs:
            m.d.sync += v.eq(outer) if flow == "In" else outer.eq(v)
        return m


def unit_design(name: str, cfg: NpuConfig, board: Board | None = None, clock_mhz: float = 50.0
                ) -> tuple[Elaboratable, list]:  # fmt: skip
    """The unit `name` of `cfg`'s core (or of `board`'s top) and its ports (its own and the memory
    clients it drives)."""
    from npu.hdl.core import acc_clients, spad_clients
    from npu.hdl.spad import client_signature, onchip_memory

    L, W = cfg.lanes, cfg.bus_bytes
    sw, aw = cfg.spad_bytes // L, cfg.acc_bytes // W
    ext = []

    def clients(words: int, width: int, write: bool, k: int) -> list:
        out = [client_signature(words, width, write).create() for _ in range(k)]
        ext.extend(out)
        return out

    CM, CN = cfg.clusters, cfg.pes_per_cluster
    if name == "core":  # every unit with its memories: the paths that cross units
        from npu.hdl.core import NpuCore

        top = _Registered(NpuCore(cfg))
        return top, top.ports
    if name in ("sdram", "bridge"):
        top = _board_unit(name, cfg, board, clock_mhz)
        return top, top.ports
    if name in ("spad", "acc"):
        mem = onchip_memory(cfg, name, spad_clients(cfg) if name == "spad" else acc_clients(cfg))
        top = _Registered(mem)
        return top, top.ports
    if name == "vector":
        from npu.hdl.vector import VectorUnit

        top = VectorUnit(cfg, clients(sw, 8 * L, False, 2), clients(sw, 8 * L, False, 2),
                         clients(aw, 8 * W, False, 2), clients(sw, 8 * L, True, 2))  # fmt: skip
    elif name == "matrix":
        from npu.hdl.matrix import MatrixUnit

        staged = bool(cfg.a_stage_bytes)  # A rows staged through two reads (hdl/matrix.py)
        top = MatrixUnit(cfg, clients(sw, 8 * L, False, 0 if staged else CM), clients(sw, 8 * L, False, CN),
                         clients(aw, 8 * W, False, cfg.c_ports), clients(aw, 8 * W, True, cfg.c_ports),
                         clients(sw, 8 * L, False, CM if cfg.a16_full_rate and not staged else 0),
                         clients(sw, 8 * L, False, 2 if staged else 0))  # fmt: skip
    elif name == "load":
        from npu.hdl.load import LoadUnit

        top = LoadUnit(cfg, clients(sw, 8 * W, True, 1)[0], clients(aw, 8 * W, True, 1)[0])
    elif name == "store":
        from npu.hdl.store import StoreUnit

        top = StoreUnit(cfg, clients(sw, 8 * W, False, 1)[0], clients(aw, 8 * W, False, 1)[0])
    elif name == "fetch":
        from npu.hdl.fetch import Fetcher

        top = Fetcher(cfg)
    else:
        raise BuildError(f"unknown unit {name!r}; units: {', '.join(UNITS)}")
    ports = [Value.cast(v) for _, _, v in top.signature.flatten(top)]
    for p in ext:
        ports += [Value.cast(v) for _, _, v in p.signature.flatten(p)]
    return top, ports


def _board_unit(name: str, cfg: NpuConfig, board: Board | None, clock_mhz: float) -> _Registered:
    """The board top's DRAM controller or serial bridge, built as `BoardCore` builds them."""
    from npu.hdl.core import dram_signature, regs_signature

    from .bridge import SerialBridge
    from .top import MAX_PACKET

    bus = dram_signature(cfg)
    if name == "sdram":
        if board is None or board.dram != "sdram":
            raise BuildError(f"unit sdram: board {board.name if board else None} has no SDR SDRAM")
        from npu.hdl.mem.sdram import SdramController

        return _Registered(SdramController(data_width=8 * cfg.bus_bytes, clock_mhz=clock_mhz,
                                           addr_width=bus.addr_width, id_width=bus.id_width + 1,
                                           read_delay=-1))  # fmt: skip
    return _Registered(SerialBridge(dram_bytes=cfg.dram_bytes, data_width=8 * cfg.bus_bytes,
                                    clk_freq=clock_mhz * 1e6, baud=board.baud if board else 115200,
                                    max_packet=MAX_PACKET, reg_addr_width=regs_signature().addr_width,
                                    id_width=bus.id_width, status_offset=0))  # fmt: skip


def _critical_path(report: dict) -> list[dict]:
    """The critical path's logic steps (cell and the cumulative delay in ns)."""
    steps = []
    for cp in report.get("critical_paths", [])[:1]:
        total = 0.0
        for e in cp["path"]:
            total += e["delay"]
            if e["type"] != "routing" and e["delay"] >= 0.1:
                steps.append({"type": e["type"], "cell": e["to"]["cell"], "at_ns": round(total, 2)})
    return steps


def _source_lines(log: str) -> list[str]:
    """The source lines (file:line) nextpnr names along the critical path, in order, once each."""
    part = log[log.rfind("Critical path report") :] if "Critical path report" in log else ""
    seen: list[str] = []
    for m in re.finditer(r"(\S+\.py:\d+)", part):
        line = m.group(1).split("/hdl/")[-1]
        if line not in seen:
            seen.append(line)
    return seen


def unit_timing(board: Board, cfg: NpuConfig, name: str, clock_mhz: float, out: Path,
                say: Callable[[str], None]) -> dict:  # fmt: skip
    """Synthesise, place and route unit `name` out of context; its Fmax against `clock_mhz`."""
    if board.family != "ecp5":
        raise BuildError(f"--unit needs an ECP5 board (nextpnr-{board.family} has no out-of-context mode)")
    env = tool_env(board.family)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    top, ports = unit_design(name, cfg, board, clock_mhz)
    (out / "unit.il").write_text(rtlil.convert(top, name="unit", ports=ports))
    say(f"[{time.monotonic() - t0:6.0f} s] synthesis (yosys) of {name}")
    script = "read_rtlil unit.il; synth_ecp5 -top unit -json unit.json"
    # the WebAssembly tools see the working directory: relative names only
    cmd = [env["YOSYS"], "-q", "-l", "yosys.log", "-p", script]
    r = subprocess.run(cmd, cwd=out, capture_output=True, text=True)
    if r.returncode:
        raise BuildError(f"yosys failed on {name}: {r.stderr[-2000:]}")
    say(f"[{time.monotonic() - t0:6.0f} s] place and route (nextpnr) of {name}")
    # the part's options as the platform's own build script gives them to nextpnr
    platform = board.platform()
    package = platform._nextpnr_package_options[platform.package].upper()
    args = [env["NEXTPNR_ECP5"], platform._nextpnr_device_options[platform.device],
            "--package", package, "--speed", str(platform.speed),
            "--out-of-context", "--json", "unit.json", "--report", "report.json", "--timing-allow-fail",
            "--freq", str(clock_mhz), "-l", "nextpnr.log", "-q", *board.nextpnr_opts.split()]  # fmt: skip
    r = subprocess.run(args, cwd=out, capture_output=True, text=True)
    if r.returncode:
        raise BuildError(f"nextpnr failed on {name}: {r.stderr[-2000:]}")
    report = json.loads((out / "report.json").read_text())
    fmax = min(c["achieved"] for c in report["fmax"].values())
    used = {k: v["used"] for k, v in report["utilization"].items() if v["used"]}
    log = (out / "nextpnr.log").read_text(errors="replace")
    return {
        "unit": name,
        "config": cfg.name,
        "device": board.device,
        "fmax_mhz": round(fmax, 2),
        "target_mhz": clock_mhz,
        "timing_met": fmax >= clock_mhz,
        "resources": used,
        "critical_path": _critical_path(report),
        "source_lines": _source_lines(log),
        "seconds": round(time.monotonic() - t0, 1),
    }


#: Yosys's ECP5 cells as the board report counts them (nextpnr's TRELLIS_COMB holds a LUT4, half a
#: CCU2C carry cell or half a distributed-RAM cell's logic)
_ECP5_CELLS = {
    "lut": {"LUT4": 1, "CCU2C": 2, "TRELLIS_DPR16X4": 2},
    "ff": {"TRELLIS_FF": 1},
    "bram": {"DP16KD": 1},
    "dsp": {"MULT18X18D": 1},
    "lutram": {"TRELLIS_DPR16X4": 1},
}


def core_resources(cfg: NpuConfig, out: Path, say: Callable[[str], None] = lambda s: None) -> dict:
    """Synthesise `cfg`'s core alone for the ECP5 (Yosys `synth_ecp5`, no place and route): its cells
    as the board report counts them (`lut`, `ff`, `bram`, `dsp`, `lutram`), Yosys's own counts under
    `cells`, and the seconds taken. The board adds its DRAM controller, serial bridge and PLL."""
    from npu.hdl.core import NpuCore

    if cfg.core != "pipelined":
        raise BuildError(f"config {cfg.name}: synthesis estimates cover the pipelined core, not {cfg.core!r}")
    if not cfg.spad_banked:  # a scratchpad of many ports is logic, not block RAM, on an FPGA
        raise BuildError(f"config {cfg.name}: synthesis estimates need a banked scratchpad (spad_banked)")
    env = tool_env("ecp5")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    say(f"synthesis (yosys) of the core of {cfg.describe()}")
    (out / "core.il").write_text(rtlil.convert(NpuCore(cfg), name="core"))
    script = "read_rtlil core.il; synth_ecp5 -top core; tee -q -o stat.json stat -json"
    r = subprocess.run([env["YOSYS"], "-q", "-l", "yosys.log", "-p", script], cwd=out,
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode:
        raise BuildError(f"yosys failed on the core of {cfg.name}: {r.stderr[-2000:]}")
    stat = json.loads((out / "stat.json").read_text())
    cells = {k: int(v) for k, v in stat["design"]["num_cells_by_type"].items()}
    used = {res: sum(n * cells.get(c, 0) for c, n in kinds.items()) for res, kinds in _ECP5_CELLS.items()}
    return {**used, "cells": cells, "seconds": round(time.monotonic() - t0, 1)}
