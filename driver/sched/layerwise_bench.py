"""`npu bench layerwise`: pairs of a compute-intensive and a memory-intensive model submitted
together on one engine, each policy's STP, ANTT, makespan and utilisation (Eyerman and Eeckhout's
multiprogram metrics), the greedy rule against an exhaustive search over interleavings on small
pairs, and a starvation scenario with and without the guard. With `rtl`, two pairs also run on the
core's RTL (sim/rtl/transport.py): makespans against the model and outputs against each model alone."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from npu.config import get_config
from npu.isa import Unit

from ..runtime import Npu
from ..transport import RtlRunner
from .layerwise import POLICIES, LayerwiseScheduler

# Each compute-bound CNN of the zoo against memory-bound MLPs at batch 1 that take about as long
# alone (on `multi`): no interleaving can beat the longer model alone, so a pair of very unequal
# lengths shows nothing of the rule. Two MLP shapes: 64 KiB layers (256 x 256, one weight tile, a
# layer loads then computes) and 256 KiB layers (512 x 512, tiled: loads stream under compute).
PAIRS = (
    ("digits_cnn", "planning"),
    ("resnet_small", "fc_deep(layers=26)"),
    ("resnet_small", "fc_deep(layers=8,width=512)"),
    ("inception_small", "fc_deep(layers=55)"),
    ("inception_small", "fc_deep(layers=17,width=512)"),
    ("multipath", "fc_deep(layers=51)"),
    ("multipath", "fc_deep(layers=16,width=512)"),
    ("longconv", "fc_deep(layers=72)"),
    ("longconv", "fc_deep(layers=23,width=512)"),
)
SMALL = (("digits_cnn", "digits_mlp"), ("digits_cnn", "planning"))
RTL_PAIRS = (("digits_cnn", "planning"), ("resnet_small", "fc_deep(layers=26)"))
RTL_POLICIES = ("fcfs", "idle-time")
UNITS = tuple(u.name.lower() for u in Unit)  # busy counters BUSY_LOAD ... BUSY_STORE
STEP_CYCLES = 10_000  # the longest segment of a cut operator: about a memory-bound MLP layer's DMA
RTL_DRAM = 4 << 20  # the simulated DRAM: both models, the ring and the driver's area (at most 2.3 MB)


@dataclass
class Prepared:
    name: str
    container: object
    x: np.ndarray


def zoo_spec(spec: str) -> tuple[str, dict[str, int]]:
    """ "fc_deep(layers=26)" -> ("fc_deep", {"layers": 26}): a zoo model and its builder's parameters."""
    name, _, args = spec.partition("(")
    params = {}
    for kv in filter(None, args.rstrip(")").split(",")):
        k, _, v = kv.partition("=")
        params[k.strip()] = int(v)
    return name, params


def prepare(
    spec: str, config: str, part: int, parts: int = 2, cache=None, step_cycles: int = STEP_CYCLES
) -> Prepared:
    """Zoo model `spec` compiled into scratchpad part `part` of `parts` equal ones, one segment per
    operator, operators cut between their steps into segments of at most `step_cycles`."""
    from ..demo import compile_zoo

    cfg = get_config(config).engine
    size = cfg.spad_bytes // parts
    name, params = zoo_spec(spec)
    c, x = compile_zoo(
        name, cfg.name, cache, params, granularity="step", step_cycles=step_cycles,
        spad_region=(part * size, size),
    )  # fmt: skip
    return Prepared(spec, c, x)


def run_set(models: list[Prepared], policy: str, config: str, transport=None, arrivals=None, **kw) -> dict:
    """Submit `models` (at `arrivals` cycles from now, default all now) under `policy`; figures and
    outputs. (A given transport, such as an RTL simulation, may have run other sets before.)"""
    npu = Npu("model", config, transport=transport)
    s = LayerwiseScheduler(npu, policy, **kw)
    t0 = npu.tr.now()
    arrivals = arrivals or [0] * len(models)
    reqs = [s.submit(m.container, [m.x], at=t0 + arrivals[i]) for i, m in enumerate(models)]
    s.run()
    c = s.counters
    return {
        "makespan": s.makespan,
        "turnaround": [r.finish - r.arrival for r in reqs],
        "compute_util": round(c["BUSY_MATRIX"] / max(1, s.makespan), 4),
        "dma_util": round((c["BUSY_LOAD"] + c["BUSY_STORE"]) / (2 * max(1, s.makespan)), 4),
        "outputs": [r.outputs for r in reqs],
        "timeline": s.timeline,
        "busy": {u: c[f"BUSY_{u.upper()}"] for u in UNITS},
    }


def metrics(turnaround: list[int], alone: list[int]) -> dict:
    """STP = sum of alone/shared; ANTT = mean of shared/alone (turnaround from arrival)."""
    ntt = [t / a for t, a in zip(turnaround, alone, strict=True)]
    return {"stp": round(sum(1 / n for n in ntt), 4), "antt": round(float(np.mean(ntt)), 4),
            "max_ntt": round(max(ntt), 4)}  # fmt: skip


def lower_bound(alone_busy: list[dict[str, int]]) -> tuple[int, str]:
    """The least makespan any interleaving could reach on one engine: every unit executes its
    instructions one at a time, so the pair takes at least the busiest unit's summed busy cycles
    (measured with each model alone: interleaving does not change an instruction's duration)."""
    total = {u: sum(b[u] for b in alone_busy) for u in UNITS}
    unit = max(total, key=total.get)
    return total[unit], unit


def bench_pair(pair: tuple[str, str], config: str, transport_fn=None) -> dict:
    models = [prepare(n, config, i) for i, n in enumerate(pair)]
    runs = [run_set([m], "fcfs", config) for m in models]
    alone = [r["makespan"] for r in runs]
    refs = [r["outputs"][0] for r in runs]
    bound, unit = lower_bound([r["busy"] for r in runs])
    if max(alone) > bound:  # neither model finishes sooner than it does alone
        bound, unit = max(alone), f"alone: {pair[alone.index(max(alone))]}"
    out = {"models": list(pair), "backend": "model", "alone": alone,
           "busy_alone": [r["busy"] for r in runs], "makespan_bound": bound, "bound_unit": unit}  # fmt: skip
    for policy in POLICIES:
        r = run_set(models, policy, config)
        for got, want in zip(r["outputs"], refs, strict=True):
            for a, b in zip(got, want, strict=True):
                if not np.array_equal(a, b):
                    raise AssertionError(f"{pair} under {policy}: outputs differ from running alone")
        out[policy] = {"makespan": r["makespan"], **metrics(r["turnaround"], alone),
                       "compute_util": r["compute_util"], "dma_util": r["dma_util"]}  # fmt: skip
    out["speedup"] = round(out["fcfs"]["makespan"] / out["idle-time"]["makespan"], 4)
    # the most any interleaving could gain over fcfs: how far the pair's mix allows the design's rule to go
    # (the busiest unit's summed busy cycles, or the longer model alone, whichever is larger)
    out["speedup_bound"] = round(out["fcfs"]["makespan"] / bound, 4)
    return out


def _rtl_runs(transport, models: list[Prepared], config: str, policies: tuple[str, ...]):
    """Inside the simulation: each model alone, then the pair under each policy."""
    alone = [run_set([m], "fcfs", config, transport=transport) for m in models]
    return alone, {p: run_set(models, p, config, transport=transport) for p in policies}


def rtl_pair(
    run_on_rtl: RtlRunner, pair: tuple[str, str], config: str, policies: tuple[str, ...] = RTL_POLICIES
) -> dict:
    """`pair` on the RTL core (through `run_on_rtl`) and on the golden model: per policy the RTL's
    figures, the model's makespan and its error, and whether every output is bit-identical to its
    model run alone (on the RTL and on the golden model)."""

    models = [prepare(n, config, i) for i, n in enumerate(pair)]
    alone_r, runs_r = run_on_rtl(_rtl_runs, models, config, policies, config=config, dram_bytes=RTL_DRAM)
    alone_m = [run_set([m], "fcfs", config) for m in models]
    alone = [a["makespan"] for a in alone_r]
    refs = [a["outputs"][0] for a in alone_m]
    out = {"models": list(pair), "backend": "rtl", "alone": alone,
           "alone_model": [a["makespan"] for a in alone_m]}  # fmt: skip
    for p in policies:
        r, m = runs_r[p], run_set(models, p, config)
        exact = all(
            np.array_equal(a, b)
            for got in (r["outputs"], [a["outputs"][0] for a in alone_r])
            for outs, want in zip(got, refs, strict=True)
            for a, b in zip(outs, want, strict=True)
        )
        out[p] = {"makespan": r["makespan"], "model_makespan": m["makespan"],
                  "makespan_error": round(m["makespan"] / r["makespan"] - 1, 4),
                  **metrics(r["turnaround"], alone), "compute_util": r["compute_util"],
                  "dma_util": r["dma_util"], "outputs_as_alone": exact}  # fmt: skip
    return out


def exhaustive(pair: tuple[str, str], config: str) -> dict:
    """The best makespan over every interleaving of the two models' layers (run on the model)."""
    models = [prepare(n, config, i) for i, n in enumerate(pair)]
    n = [len([s for s in m.container.manifest.segments if s.kind == "npu"]) for m in models]
    best = None
    count = 0
    for pos in itertools.combinations(range(sum(n)), n[0]):
        order = [0 if i in pos else 1 for i in range(sum(n))]
        r = run_set(models, "order", config, order=order)
        count += 1
        if best is None or r["makespan"] < best:
            best = r["makespan"]
    greedy = run_set(models, "idle-time", config)["makespan"]
    return {"models": list(pair), "layers": n, "interleavings": count, "best": best, "greedy": greedy,
            "greedy_over_best": round(greedy / best, 4)}  # fmt: skip


def starvation(config: str, k: int = 6, limit: int = 8) -> dict:
    """A memory-bound request (fc_heavy) submitted with `k` requests of each of three other models
    (each model in its own quarter of the scratchpad, so three candidates besides it are usually
    ready): its layers' DMA does not hide under compute, so the rule passes them over while others
    remain; with the guard, a candidate passed over `limit` times is forced."""
    names = ["fc_heavy", "digits_cnn", "planning", "digits_mlp"]
    prep = [prepare(n, config, i, 4) for i, n in enumerate(names)]
    alone = {m.name: run_set([m], "fcfs", config)["makespan"] for m in prep}
    models = [prep[0]] + [m for _ in range(k) for m in prep[1:]]
    base = [alone[m.name] for m in models]
    out = {"models": [m.name for m in models]}
    for label, lim in (("without_guard", 10**9), ("with_guard", limit)):
        r = run_set(models, "idle-time", config, starve_limit=lim)
        out[label] = {
            "starve_limit": lim if lim < 10**9 else None,
            **metrics(r["turnaround"], base),
            "starved_ntt": round(r["turnaround"][0] / base[0], 4),
            "makespan": r["makespan"],
        }
    return out


def bench_layerwise(
    config: str = "multi", progress: Callable[[str], None] | None = None, rtl: RtlRunner | None = None
) -> dict:
    """Every pair on the model (with `rtl`, the harness's `run_on_rtl`: RTL_PAIRS also on the RTL
    core); JSON-ready."""
    say = progress or (lambda _m: None)
    pairs = []
    for c, m in PAIRS:
        say(f"pair {c} + {m}")
        pairs.append(bench_pair((c, m), config))
    gve = []
    for p in SMALL:
        say(f"exhaustive {p[0]} + {p[1]}")
        gve.append(exhaustive(p, config))
    say("starvation")
    st = starvation(config)
    ratio = float(np.mean([p["speedup"] for p in pairs]))
    res = {
        "config": config,
        "pairs": pairs,
        "mean_makespan_fcfs_over_idle_time": round(ratio, 4),
        "mean_speedup_bound": round(float(np.mean([p["speedup_bound"] for p in pairs])), 4),
        "greedy_vs_exhaustive": gve,
        "starvation": st,
    }
    if rtl:
        res["rtl"] = []
        for p in RTL_PAIRS:
            say(f"rtl {p[0]} + {p[1]}")
            res["rtl"].append(rtl_pair(rtl, p, config))
    return res


def format_layerwise(res: dict) -> str:
    lines = [f"{'pair':<34}{'policy':<11}{'makespan':>10}{'STP':>7}{'ANTT':>7}{'compute':>9}{'DMA':>7}"]
    for p in res["pairs"]:
        for pol in POLICIES:
            r = p[pol]
            lines.append(f"{' + '.join(p['models']):<34}{pol:<11}{r['makespan']:>10}{r['stp']:>7.2f}"
                         f"{r['antt']:>7.2f}{r['compute_util']:>9.2f}{r['dma_util']:>7.2f}")  # fmt: skip
    lines.append(f"mean makespan fcfs / idle-time: {res['mean_makespan_fcfs_over_idle_time']:.3f} "
                 f"(no interleaving does better than {res['mean_speedup_bound']:.3f})")  # fmt: skip
    for g in res["greedy_vs_exhaustive"]:
        lines.append(f"greedy vs best of {g['interleavings']} interleavings ({' + '.join(g['models'])}): "
                     f"{g['greedy']} / {g['best']} = {g['greedy_over_best']:.3f}")  # fmt: skip
    for p in res.get("rtl", []):
        for pol in RTL_POLICIES:
            r = p[pol]
            lines.append(f"RTL {' + '.join(p['models'])} {pol}: makespan {r['makespan']} (model "
                         f"{r['model_makespan']}, {100 * r['makespan_error']:+.1f} %), outputs as alone "
                         f"{r['outputs_as_alone']}")  # fmt: skip
    st = res["starvation"]
    w, wg = st["without_guard"], st["with_guard"]
    lines.append(f"starvation: fc_heavy's normalised turnaround {w['starved_ntt']:.2f} without the guard, "
                 f"{wg['starved_ntt']:.2f} with it (max over all {w['max_ntt']:.2f} / "
                 f"{wg['max_ntt']:.2f})")  # fmt: skip
    return "\n".join(lines)
