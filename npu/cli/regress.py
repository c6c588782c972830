"""`npu regress`: the random-program regression of the RTL against the golden model, in shards spread
over workers: Ray (the `cluster` extra; a local instance by default, `--address HOST:PORT` or
RAY_ADDRESS for a cluster) or local processes. Shard results are cached by the digest of their inputs
and the sources, so a re-run or an interrupted run only runs what is missing; Ctrl-C stops the
workers and reports what finished. Each failing seed replays with `npu hdl replay`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from ..config import PRESETS, get_config
from . import workers
from .common import int_in

HELP = "random-program RTL-vs-model regression in shards over workers (Ray or local processes)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="tiny", help=f"hardware preset: {', '.join(PRESETS)} (default tiny)")
    p.add_argument(
        "--programs", type=int_in(1, 10**7), default=100, help="random programs to run (default 100)"
    )
    p.add_argument(
        "--first-seed", type=int_in(0, 2**32 - 1), help="the first program's seed (default 1000000)"
    )
    p.add_argument("--shard-size", type=int_in(1, 10_000), default=25, help="programs per task (default 25)")
    workers.add_arguments(p, "shards")
    p.add_argument("--cache", default="build/regress", help="shard results (default build/regress)")
    p.add_argument("--no-cache", action="store_true", help="run every shard again")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from npu.files import JsonCache
    from npu.sim.rtl.regress import FIRST_SEED, plan, run_shard, sources_digest

    cfg = get_config(args.config)
    first = FIRST_SEED if args.first_seed is None else args.first_seed
    shards = plan(cfg.name, args.programs, first, args.shard_size)
    digest = sources_digest()
    cache = JsonCache(Path(args.cache))
    results: dict = {}
    for s in shards:
        hit = None if args.no_cache else cache.get(s.key(digest))
        if hit is not None:
            results[s] = hit
    todo = [s for s in shards if s not in results]
    engine = workers.engine_of(args)
    bar = workers.progress(args.programs, "npu regress", "program")
    if bar is not None:
        bar.update(sum(len(s.seeds) for s in results))
    errors, interrupted = [], False
    t0 = time.perf_counter()
    try:
        for shard, res in workers.run_tasks(run_shard, todo, args):
            if isinstance(res, Exception):
                errors.append(
                    {"seeds": [shard.seeds[0], shard.seeds[-1]], "error": f"{type(res).__name__}: {res}"}
                )
            else:
                results[shard] = res
                cache.put(shard.key(digest), {**res, "shard": dataclasses.asdict(shard)})
            if bar is not None:
                bar.update(len(shard.seeds))
            else:
                print(f"npu regress: {len(results)}/{len(shards)} shards", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
    wall = time.perf_counter() - t0
    ran = [results[s] for s in todo if s in results]
    failures = sorted((f for r in results.values() for f in r["failures"]), key=lambda f: f["seed"])
    out = {
        "config": cfg.name,
        "engine": engine,
        "programs": sum(r["programs"] for r in results.values()),
        "programs_asked": args.programs,
        "failures": [f["seed"] for f in failures],
        "failure_details": failures,
        "errors": errors,
        "shards": len(shards),
        "shards_cached": len(shards) - len(todo),
        "programs_per_s": round(sum(r["programs"] for r in ran) / wall, 3) if ran and wall > 0 else None,
        "cycles": sum(r["cycles"] for r in results.values()),
        "interrupted": interrupted,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{cfg.name}: {out['programs']} of {args.programs} programs, {len(failures)} failing, "
            f"{len(errors)} shards in error ({engine}; {out['shards_cached']} of {len(shards)} shards "
            f"from the cache; {out['programs_per_s']} programs/s)" + (" - interrupted" if interrupted else "")
        )
        for f in failures:
            replay = f"npu hdl replay --config {cfg.name} --seed {f['seed']}"
            replay += " --pause every" if f["pause"] == "every" else ""
            print(f"  seed {f['seed']}: {f['differs']}  ({replay})")
        for e in errors:
            print(f"  seeds {e['seeds'][0]}..{e['seeds'][1]}: {e['error']}")
    if interrupted:
        return 130
    return 1 if failures or errors else 0
