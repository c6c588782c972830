"""`npu build --board NAME`: a bitstream for a dev board (synthesis, place and route and packing with
the YoWASP tools), with a report of resources, Fmax against the target, timing, build time and peak
GOPS; `npu flash --board NAME` loads it with openFPGALoader."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import PRESETS, get_config
from ..registers import MAX_ENGINES
from .common import CliError, int_in

HELP = "build a bitstream for a dev board (YoWASP Yosys and nextpnr)"


def known_boards():
    from npu.hdl.boards.boards import BOARDS

    return BOARDS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--board", required=True, help=f"the board: {', '.join(known_boards())}")
    p.add_argument("--config", help=f"hardware preset (default: the board's own): {', '.join(PRESETS)}")
    p.add_argument("--engines", type=int_in(1, MAX_ENGINES), help="engines (default: the preset's)")
    p.add_argument("--clock", type=float, metavar="MHZ", help="core clock in MHz (default: the board's)")
    p.add_argument("-o", "--output", metavar="DIR", help="build folder (default build/boards/<board>)")
    p.add_argument(
        "--unit",
        help="time one unit of the core alone instead (ECP5 boards, out of context): "
        "fetch, load, store, matrix, vector, spad, acc, core (all of them, without the board's "
        "DRAM controller and serial bridge), or the board top's sdram controller or "
        "serial bridge",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def board_and_config(args: argparse.Namespace):
    boards = known_boards()
    if args.board not in boards:
        raise CliError(f"unknown board {args.board!r}; known boards: {', '.join(boards)}")
    board = boards[args.board]
    cfg = get_config(args.config or board.preset)
    if args.engines is not None:
        cfg = cfg.replace(engines=args.engines)
    if cfg.dram_bytes > board.dram_bytes:
        raise CliError(
            f"config {cfg.name!r} addresses {cfg.dram_bytes} bytes of DRAM "
            f"but {board.name} has {board.dram_bytes}"
        )
    return board, cfg


def run(args: argparse.Namespace) -> int:
    from npu.hdl.boards.build import BuildError, build

    board, cfg = board_and_config(args)
    clock = args.clock or board.clock_mhz
    out = Path(args.output or f"build/boards/{board.name}")

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.unit:
        return _unit(args, board, cfg, clock, say)
    try:
        report = build(board, cfg, clock, out, say)
    except BuildError as e:
        raise CliError(str(e)) from None
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_report(report))
    return 0 if report["timing_met"] else 1


def _unit(args: argparse.Namespace, board, cfg, clock: float, say) -> int:
    from npu.hdl.boards.build import BuildError
    from npu.hdl.boards.units import unit_timing

    out = Path(args.output or f"build/boards/{board.name}-{args.unit}")
    try:
        r = unit_timing(board, cfg, args.unit, clock, out, say)
    except BuildError as e:
        raise CliError(str(e)) from None
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print(
            f"{r['unit']} of {r['config']} on {r['device']} (out of context): {r['fmax_mhz']} MHz against "
            f"{r['target_mhz']} MHz ({'met' if r['timing_met'] else 'NOT met'}), {r['seconds']} s"
        )
        print("  resources: " + ", ".join(f"{k} {v}" for k, v in r["resources"].items()))
        print("  critical path through: " + ", ".join(r["source_lines"][:12]))
    return 0 if r["timing_met"] else 1


def format_report(r: dict) -> str:
    lines = [
        f"{r['board']} ({r['device']}): {r['config']} ({r['config_id']}), {r['engines']} engine(s), "
        f"{r['macs_per_cycle']} MACs/cycle at {r['clock_mhz']} MHz = {r['peak_gops']} GOPS peak"
    ]
    for name, u in r["resources"].items():
        lines.append(
            f"  {name:<7} {u['used']:>7} / {u['available']:<7} ({100 * u['used'] / u['available']:.0f} %)"
        )
    for clk, f in r["fmax"].items():
        ok = "met" if f["achieved_mhz"] >= f["target_mhz"] else "FAILED"
        lines.append(f"  clock {clk}: {f['achieved_mhz']} MHz achieved, {f['target_mhz']} MHz target: {ok}")
    lines.append(f"  timing {'met' if r['timing_met'] else 'NOT met'}; built in {r['build_seconds']} s")
    lines.append(f"  bitstream: {r['bitstream']}")
    return "\n".join(lines)
