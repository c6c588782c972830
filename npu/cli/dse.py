"""`npu dse`: design-space exploration over hardware configurations. Every point of the space (a base
preset with parameters changed, `--param`) compiles each model with the real compiler and runs it on
the golden model (cycles, latency at the preset's clock, MAC utilisation); the Pareto candidates
(latency against MACs/cycle and on-chip memory) are synthesised (Yosys: LUT, FF, block RAM, DSP of the
core) and the fastest that fits `--board` is named; `--pnr K` also places and routes the best K on
the board for their Fmax. Tasks run on Ray (a local instance by default, `--address` for a cluster)
or local processes; results are cached by the digest of their inputs and sources, so a re-run or an
interrupted run only runs what is missing. Writes dse.json and front.png to `--out`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import PRESETS, get_config
from ..files import JsonCache, replacing, write_atomic
from . import workers
from .common import CliError, int_in

HELP = "design-space exploration: configurations x models on the golden model, synthesis of the front"
#: the default models: the zoo's CNNs of three sizes and an MLP
DEFAULT_MODELS = ("digits_cnn", "resnet_small", "digits_mlp")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from npu.explore.dse import PARAMS

    p.add_argument("--board", help="a board (ulx3s): its preset is the base and its device the budget")
    p.add_argument(
        "--config", help=f"the base preset ({', '.join(PRESETS)}; default: the board's, else ulx3s)"
    )
    p.add_argument(
        "--models",
        help=f"comma-separated zoo names or MODEL.onnx:CALIB.npy (default {','.join(DEFAULT_MODELS)})",
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="a parameter's values (repeatable; replaces the default space): "
        + "; ".join(f"{k}: {v}" for k, v in PARAMS.items()),
    )
    p.add_argument("--sample", type=int_in(1, 100_000), help="a seeded random sample of N points of the grid")
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0, help="the sample's seed (default 0)")
    p.add_argument(
        "--activations",
        choices=["auto", "int8", "int16"],
        default="auto",
        help="the compiler's activation type (default auto)",
    )
    p.add_argument(
        "--synth",
        type=int_in(0, 1000),
        default=4,
        help="synthesise the N fastest Pareto candidates (default 4; 0: no synthesis)",
    )
    p.add_argument(
        "--pnr",
        type=int_in(0, 100),
        default=0,
        help="place and route the K fastest that fit --board (default 0; about 15 min each)",
    )
    workers.add_arguments(p, "tasks")
    p.add_argument("--out", default="out/dse", help="dse.json and front.png (default out/dse)")
    p.add_argument("--cache", default="build/dse", help="task results (default build/dse)")
    p.add_argument("--no-cache", action="store_true", help="run every task again")
    p.add_argument("--json", action="store_true", help="print the JSON on stdout")


def _space(args: argparse.Namespace, base) -> dict:
    from npu.explore.dse import default_space, parse_param

    space: dict = {}
    for text in args.param:
        name, values = parse_param(text)
        space[name] = values
    return space or default_space(base)


def _say(msg: str) -> None:
    print(f"npu dse: {msg}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from npu.explore import dse

    board = None
    if args.board:
        from npu.hdl.boards.boards import BOARDS

        if args.board not in BOARDS:
            raise CliError(f"unknown board {args.board!r}; known boards: {', '.join(BOARDS)}")
        board = BOARDS[args.board]
    base = get_config(args.config or (board.preset if board else "ulx3s"))
    if args.pnr and board is None:
        raise CliError("--pnr needs --board")
    models = [
        dse.model_spec(m.strip()) for m in (args.models or ",".join(DEFAULT_MODELS)).split(",") if m.strip()
    ]
    if len({m.name for m in models}) < len(models):
        raise CliError("--models names a model twice")
    points = dse.grid(base, _space(args, base), args.sample, args.seed)
    valid = [p for p in points if p.config is not None]
    cache = None if args.no_cache else JsonCache(Path(args.cache))
    engine = workers.engine_of(args)
    _say(f"{len(points)} points ({len(points) - len(valid)} invalid) x {len(models)} models on {engine}")
    tasks = [dse.EvalTask(p.config, m, args.activations) for p in valid for m in models]
    evals, errors, stopped = workers.run_cached(dse.evaluate, tasks, cache, args, "npu dse: models", "run")
    by_point: dict = {}
    for t, r in evals.items():
        by_point.setdefault(t.config.config_id, {})[t.model.name] = r
    names = [m.name for m in models]
    rows = [dse.summarize(p, by_point.get(p.config.config_id, {}) if p.config else {}, names) for p in points]
    rows[0]["base"] = True
    out = {
        "base": base.name,
        "board": board.name if board else None,
        "models": names,
        "engine": engine,
        "points": rows,
        "errors": [_error(t, e) for t, e in errors],
    }
    front = dse.pareto(rows, ("latency_us", "macs_per_cycle", "onchip_bytes"))
    out["proxy_front"] = [rows[i]["label"] for i in front]
    configs = {f"{p.config.config_id:#010x}": p.config for p in valid}
    if not stopped and args.synth:
        stopped = _synthesis(args, rows, front, configs, board, cache, out)
    if not stopped and args.pnr:
        stopped = _pnr(args, rows, configs, board, cache, out)
    out["interrupted"] = stopped
    _write(args, out, rows)
    return 130 if stopped else (1 if out["errors"] else 0)


def _error(task, e: Exception) -> dict:
    what = getattr(task, "model", None)
    return {
        "config": task.config.name,
        **({"model": what.name} if what else {}),
        "error": f"{type(e).__name__}: {e}",
    }


def _synthesis(args, rows: list[dict], front: list[int], configs: dict, board, cache, out: dict) -> bool:
    """Synthesise the fastest `--synth` candidates of the proxy front; the resource front and the
    fastest point that fits the board. Returns whether Ctrl-C stopped it."""
    from npu.explore import dse

    if not get_config(out["base"]).spad_banked:
        _say(f"synthesis left out: {out['base']} has a multi-port scratchpad (FPGAs need spad_banked)")
        return False
    pick = [i for i in front if rows[i]["valid"]][: args.synth]
    if rows[0].get("latency_us") is not None and 0 not in pick:
        pick.append(0)  # the base, for comparison
    at = {rows[i]["config_id"]: i for i in pick}
    tasks = [dse.SynthTask(configs[rows[i]["config_id"]]) for i in pick]
    _say(f"synthesis of {len(tasks)} candidates (Yosys; a few minutes each)")
    res, errors, stopped = workers.run_cached(dse.synthesize, tasks, cache, args, "npu dse: synthesis")
    out["errors"] += [_error(t, e) for t, e in errors]
    for t, r in res.items():
        row = rows[at[f"{t.config.config_id:#010x}"]]
        row["resources"] = {k: r[k] for k in ("lut", "ff", "bram", "dsp", "lutram")}
        row["synth_s"] = r["seconds"]
        if board is not None and board.capacity:
            row["fits"] = dse.fits(
                row["resources"], {k: v for k, v in board.capacity.items() if k in row["resources"]}
            )
    synthed = [r for r in rows if "resources" in r]
    # the resource front: latency against LUT, DSP and block RAM (flattened copies of the rows)
    flat = [{"latency_us": r["latency_us"], **r["resources"]} if "resources" in r else {} for r in rows]
    out["front"] = [rows[i]["label"] for i in dse.pareto(flat, ("latency_us", "lut", "dsp", "bram"))]
    fitting = sorted((r for r in synthed if r.get("fits", True)), key=lambda r: r["latency_us"])
    out["best"] = fitting[0]["label"] if fitting else None
    return stopped


def _pnr(args, rows: list[dict], configs: dict, board, cache, out: dict) -> bool:
    from npu.explore import dse

    fitting = sorted((r for r in rows if r.get("fits")), key=lambda r: r["latency_us"])[: args.pnr]
    if not fitting:
        _say("--pnr: no synthesised point fits the board")
        return False
    folder = Path(args.out) / "pnr"
    tasks = [
        dse.PnrTask(board.name, configs[r["config_id"]], board.clock_mhz, str(folder / r["config_id"]))
        for r in fitting
    ]
    _say(f"place and route of {len(tasks)} points on the {board.name}")
    res, errors, stopped = workers.run_cached(
        dse.place_and_route, tasks, cache, args, "npu dse: place and route"
    )
    out["errors"] += [_error(t, e) for t, e in errors]
    for t, r in res.items():
        row = next(x for x in fitting if x["config_id"] == f"{t.config.config_id:#010x}")
        row["pnr"] = {
            **r,
            "latency_us": round(row["latency_us"] * board.clock_mhz / max(r["achieved_mhz"], 1e-9), 3),
        }
    return stopped


def _write(args, out: dict, rows: list[dict]) -> None:
    folder = Path(args.out)
    write_atomic(folder / "dse.json", json.dumps(out, indent=1) + "\n")
    _plot(out, rows, folder / "front.png")
    if args.json:
        print(json.dumps(out))
        return
    base = rows[0]
    print(
        f"{len(rows)} points over {', '.join(out['models'])} (base {out['base']}: "
        f"{base.get('latency_us')} us geometric mean)"
    )
    print(f"{'point':44} {'MACs':>5} {'latency us':>11} {'util':>6} {'LUT':>7} {'DSP':>4} {'BRAM':>4} fits")
    shown = [r for r in rows if r["label"] in out.get("front", out["proxy_front"]) or r.get("base")]
    for r in shown:
        res = r.get("resources", {})
        print(
            f"{r['label'][:44]:44} {r.get('macs_per_cycle', '-'):>5} {str(r.get('latency_us')):>11} "
            f"{str(r.get('utilization', '-')):>6} {str(res.get('lut', '-')):>7} "
            f"{str(res.get('dsp', '-')):>4} {str(res.get('bram', '-')):>4} {r.get('fits', '-')}"
        )
    if "best" in out:
        print(f"best that fits: {out['best']}" if out["best"] else "no synthesised point fits the board")
    for e in out["errors"]:
        print(f"  error: {e}")
    print(f"wrote {folder / 'dse.json'} and {folder / 'front.png'}")


def _plot(out: dict, rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("latency_us") is not None]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    ax.scatter([r["macs_per_cycle"] for r in ok], [r["latency_us"] for r in ok], c="#999", label="points")
    pf = [r for r in ok if r["label"] in out["proxy_front"]]
    ax.scatter(
        [r["macs_per_cycle"] for r in pf], [r["latency_us"] for r in pf], c="C0", label="Pareto (proxy)"
    )
    if ok and rows[0].get("latency_us") is not None:
        ax.scatter(
            [rows[0]["macs_per_cycle"]], [rows[0]["latency_us"]], marker="*", s=160, c="C3", label="base"
        )
    ax.set(xlabel="MACs/cycle", ylabel="latency (us, geometric mean)")
    if ok:  # no point evaluated (every task failed, or Ctrl-C came first): empty axes, not an error
        ax.set(xscale="log", yscale="log")
    ax.legend(fontsize=8)
    ax = axes[1]
    syn = [r for r in ok if "resources" in r]
    for r in syn:
        color = "C2" if r.get("fits", True) else "C3"
        ax.scatter(r["resources"]["lut"], r["latency_us"], c=color)
        ax.annotate(r["label"], (r["resources"]["lut"], r["latency_us"]), fontsize=6)
    ax.set(
        xlabel="LUT4 (synthesis, core)", ylabel="latency (us)", title="synthesised (green: fits the board)"
    )
    fig.suptitle(f"npu dse: base {out['base']}, models {', '.join(out['models'])}")
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
