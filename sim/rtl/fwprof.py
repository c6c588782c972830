"""The micro core's firmware profile: where its cycles go, function by function, for chosen probe
programs (`sim/rtl/probes.py`) run on the RTL.

    python -m npu.sim.rtl.fwprof                      # every probe, a table each
    python -m npu.sim.rtl.fwprof "sync x8" "matmul 4x4x16" --top 8 --json

The bench samples the processor's PC (PicoRV32's `reg_pc`) every cycle of each run; the cycles are
summed by the firmware function whose code holds the PC (the ELF's symbols: the committed sources
compiled again, checked to give the committed image). Functions the compiler inlined count in their
caller (`main` holds the dispatcher's loop). `--pcs N` lists the N hottest addresses as well.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys

from npu.config import get_config


def by_function(pcs: dict[int, int], functions: list[tuple[int, int, str]]) -> dict[str, int]:
    """Cycles summed by the function whose code holds each PC ("?" outside every function)."""
    starts = [f[0] for f in functions]
    out: dict[str, int] = {}
    for pc, n in pcs.items():
        i = bisect.bisect_right(starts, pc) - 1
        name = functions[i][2] if i >= 0 and pc < functions[i][0] + functions[i][1] else "?"
        out[name] = out.get(name, 0) + n
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def profile(labels: list[str], config: str = "icebreaker") -> list[dict]:
    """Run each probe of `labels` (all when empty) on the micro core's RTL with the PC sampled; one
    record per probe: its CYCLES, its cycles by function and by PC."""
    from npu.hdl.micro.firmware import functions
    from npu.sim.rtl.core import run_rtl
    from npu.sim.rtl.probes import dma_probes, encode, op_probes
    from npu.sim.rtl.suite import _raw

    cfg = get_config(config)
    if cfg.core != "micro":
        raise SystemExit(f"error: configuration {config!r} has no firmware to profile (core {cfg.core!r})")
    probes = {**dma_probes(cfg), **op_probes(cfg)}
    unknown = [k for k in labels if k not in probes]
    if unknown:
        raise SystemExit(f"error: no probe named {unknown[0]!r}; probes: {', '.join(probes)}")
    chosen = {k: probes[k] for k in labels} if labels else probes
    blobs = encode(chosen)
    funcs = functions()
    print(f"profiling {len(blobs)} probe programs on the {config} RTL", file=sys.stderr)
    jobs = [_raw(k, [b]) for k, b in blobs.items()]
    recs = run_rtl(cfg, jobs, fast_dram=True, profile=True)
    out = []
    for label, rec in zip(blobs, recs, strict=True):
        if rec.status != "DONE":
            raise SystemExit(f"error: probe {label!r} ended {rec.status} (error code {rec.error_code})")
        pcs = rec.pc_cycles or {}
        out.append({"probe": label, "cycles": rec.counters["CYCLES"], "sampled": sum(pcs.values()),
                    "functions": by_function(pcs, funcs), "pcs": pcs})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m npu.sim.rtl.fwprof", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("probes", nargs="*", help="probe labels (sim/rtl/probes.py); default: all")
    p.add_argument("--config", default="icebreaker", help="a micro-core configuration (default icebreaker)")
    p.add_argument("--top", type=int, default=10, help="functions listed per probe (default 10)")
    p.add_argument("--pcs", type=int, default=0, help="also list the N hottest PCs per probe")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    args = p.parse_args(argv)
    rows = profile(args.probes, args.config)
    for r in rows:
        hot = sorted(r.pop("pcs").items(), key=lambda kv: -kv[1])[: args.pcs]
        r["functions"] = dict(list(r["functions"].items())[: args.top])
        if args.pcs:
            r["pcs"] = {f"{pc:#x}": n for pc, n in hot}
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        print(f"{r['probe']}: {r['cycles']:,} cycles (run; {r['sampled']:,} sampled from START to stop)")
        for name, n in r["functions"].items():
            print(f"  {name:<14} {n:>9,}  {100 * n / max(1, r['sampled']):5.1f} %")
        for pc, n in r.get("pcs", {}).items():
            print(f"  {pc:<14} {n:>9,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
