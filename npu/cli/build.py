"""`npu build --board NAME`: a bitstream for a dev board (synthesis, place and route and packing with
the YoWASP tools), with a report of resources, Fmax against the target, timing, build time and peak
GOPS; `npu flash --board NAME` loads it with openFPGALoader."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import PRESETS
from ..files import write_atomic
from ..registers import MAX_ENGINES
from . import workers
from .common import CliError, int_in

HELP = "build a bitstream for a dev board (YoWASP Yosys and nextpnr)"
#: nextpnr's placers and routers (nextpnr-ecp5 and nextpnr-ice40 0.11 have each)
PLACERS = ("heap", "static", "sa")
ROUTERS = ("router1", "router2")


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
    p.add_argument(
        "--seeds",
        type=int_in(1, 1000),
        default=1,
        help="place and route with this many nextpnr seeds in parallel and keep the best timing "
        "(the bitstream and report of the best in the build folder; each seed's in seed-N/); the "
        "others stop once one meets timing, unless --all-seeds",
    )
    p.add_argument(
        "--first-seed",
        type=int_in(1, 1_000_000),
        default=None,
        metavar="K",
        help="nextpnr's placement seed of a single build, or with --seeds N the first of the N "
        "seeds K .. K + N - 1 (default: the board's seed, or 1 with --seeds)",
    )
    p.add_argument(
        "--all-seeds",
        action="store_true",
        help="with --seeds: build every seed to the end and keep the best Fmax (default: stop the "
        "others once one meets timing)",
    )
    p.add_argument(
        "--placer",
        choices=PLACERS,
        help="nextpnr's placer (default: the board's; docs/boards.md compares them per preset)",
    )
    p.add_argument("--router", choices=ROUTERS, help="nextpnr's router (default: the board's)")
    p.add_argument(
        "--dsp-sites",
        choices=("auto", "fixed", "placer"),
        default="auto",
        help="the matrix unit's multipliers: on fixed sites, a cluster to a stretch of a DSP row "
        "(ECP5), or where the placer puts them; auto (default): fixed where the array takes more "
        "than half the part's multipliers",
    )
    workers.add_arguments(p, "--seeds builds")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def board_and_config(args: argparse.Namespace):
    boards = known_boards()
    if args.board not in boards:
        raise CliError(f"unknown board {args.board!r}; known boards: {', '.join(boards)}")
    board = boards[args.board].with_pnr(getattr(args, "placer", None), getattr(args, "router", None))
    return board, board.config(args.config, args.engines)


def run(args: argparse.Namespace) -> int:
    from npu.hdl.boards.build import BuildError, build

    board, cfg = board_and_config(args)
    clock = args.clock or board.clock_mhz
    out = Path(args.output or f"build/boards/{board.name}")

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.unit:
        if args.seeds > 1 or args.first_seed is not None:
            raise CliError("--seeds builds the whole board (so does --first-seed); not with --unit")
        return _unit(args, board, cfg, clock, say)
    if args.seeds > 1:
        report = _seeds(args, board, cfg, clock, out, say)
    else:
        try:
            report = build(board, cfg, clock, out, say, seed=args.first_seed, dsp_sites=dsp_sites(args))
        except BuildError as e:
            raise CliError(str(e)) from None
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_report(report))
    return 0 if report["timing_met"] else 1


def dsp_sites(args: argparse.Namespace) -> bool | None:
    """`--dsp-sites` as `build`'s argument: None (auto), True (fixed) or False (placer)."""
    return {"auto": None, "fixed": True, "placer": False}[getattr(args, "dsp_sites", "auto")]


def build_seed(task: tuple) -> dict:
    """One seed's build (a worker's task): (board, configuration, clock, folder, seed, DSP sites)."""
    from npu.hdl.boards.build import build

    board, cfg, clock, out, seed, sites = task
    return build(board, cfg, clock, Path(out), seed=seed, dsp_sites=sites)


def best_of(reports: list[dict]) -> dict:
    """The build with the best timing: met before not met, then the largest worst ratio of achieved to
    target clock, then the lowest seed."""

    def margin(r: dict) -> float:
        return min((f["achieved_mhz"] / f["target_mhz"] for f in r["fmax"].values()), default=0.0)

    return max(reports, key=lambda r: (r["timing_met"], margin(r), -r["seed"]))


def _seeds(args: argparse.Namespace, board, cfg, clock: float, out: Path, say) -> dict:
    """`--seeds N`: N builds in parallel (Ray or local processes); the best one's bitstream and report
    go to `out`, every seed's stays in out/seed-N."""
    import shutil

    from npu.hdl.boards.build import STOP_FILE, BuildStopped

    # absolute folders: a Ray worker may run in another directory (its STOP file is looked up there)
    first = args.first_seed or 1
    seeds = range(first, first + args.seeds)
    tasks = [(board, cfg, clock, str(out.resolve() / f"seed-{k}"), k, dsp_sites(args)) for k in seeds]
    for task in tasks:  # a STOP left by an earlier run
        (Path(task[3]) / STOP_FILE).unlink(missing_ok=True)
    until = "every seed's end" if args.all_seeds else "the first that meets timing"
    say(f"{args.seeds} place-and-route seeds on {workers.engine_of(args)} workers, until {until}")
    done, errors, stopped = [], [], []
    for task, res in workers.run_tasks(build_seed, tasks, args):
        if isinstance(res, BuildStopped):
            stopped.append(task[4])
            say(f"seed {task[4]}: stopped")
            continue
        if isinstance(res, Exception):
            errors.append({"seed": task[4], "error": f"{type(res).__name__}: {res}"})
            say(f"seed {task[4]}: failed: {res}")
            continue
        done.append(res)
        fmax = ", ".join(f"{f['achieved_mhz']} MHz" for f in res["fmax"].values())
        met = "met" if res["timing_met"] else "not met"
        say(f"seed {res['seed']}: {fmax} ({met}), {len(done)}/{args.seeds}")
        if res["timing_met"] and not args.all_seeds:  # the others stop (their builds watch the file)
            for other in tasks:
                if other[4] != res["seed"]:
                    Path(other[3]).mkdir(parents=True, exist_ok=True)
                    (Path(other[3]) / STOP_FILE).touch()
    if not done:
        raise CliError("every seed's build failed: " + "; ".join(e["error"] for e in errors))
    best = dict(best_of(done))
    out.mkdir(parents=True, exist_ok=True)
    if best["bitstream"]:
        target = out / Path(best["bitstream"]).name
        shutil.copyfile(best["bitstream"], target)
        best["bitstream"] = str(target)
    best["seeds"] = sorted(
        ({"seed": r["seed"], "fmax": r["fmax"], "timing_met": r["timing_met"],
          "build_seconds": r["build_seconds"]} for r in done),
        key=lambda r: r["seed"],
    )  # fmt: skip
    best["seed_errors"] = errors
    best["seeds_stopped"] = sorted(stopped)
    write_atomic(out / "build_report.json", json.dumps(best, indent=1) + "\n")
    return best


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
    pnr = f" (nextpnr: {r['placer']} placer, {r['router']})" if "placer" in r else ""
    lines.append(f"  timing {'met' if r['timing_met'] else 'NOT met'}; built in {r['build_seconds']} s{pnr}")
    if "seeds" in r:
        tried = ", ".join(
            f"{s['seed']}: " + "/".join(str(f["achieved_mhz"]) for f in s["fmax"].values())
            for s in r["seeds"]
        )
        lines.append(f"  best of {len(r['seeds'])} seeds: seed {r['seed']} (MHz per seed: {tried})")
        if r.get("seeds_stopped"):
            lines.append(f"  stopped once seed {r['seed']} met timing: seeds {r['seeds_stopped']}")
    lines.append(f"  bitstream: {r['bitstream']}")
    return "\n".join(lines)
