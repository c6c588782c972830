"""`npu bench opqueue`: operator-queue policies across the engines of a SoC.

Several applications (compiled with `--granularity operator` and profiled alone, so every operator
carries its measured reference runtime) receive jobs by seeded Poisson arrivals at an offered load
(the fraction of the engines' capacity the arriving work needs). Each run drives an `Npu` of N
engines with one dispatch policy and reports per-application latency (mean, p99), the makespan,
each engine's utilisation and the imbalance (max / mean busy cycles). `scaling` is the throughput of
a saturating load (every job at cycle 0) with 1, 2 and 4 engines, next to the bound of the shared DRAM
port (the bytes every job moves, at one bus word per cycle per direction).

The mix makes the design's case common: `longconv`'s one long convolution (352k cycles) next to
`multipath`, whose 42 operators are all 40x shorter and become ready eight at once, with about the
same work per job, and `planning`, a short MLP. Counting puts part of such a burst behind the long
operator; the expected time does not. With `inception_small` as the third app (operators of up to
78k cycles, four branches at a time, half of the load) every queue is deep with its own operators and
counting does about as well (docs/driver.md). Each model is loaded once per engine by default, so
few jobs are in flight and a queue holds few operators of very different sizes (the design's case);
with more copies every queue fills with operators of every application and counting follows the
work (`--instances`). At 100 jobs per application the p99 is about the second-largest latency, so
one seed's cut varies by about +-10 points: compare several `--seed`s.

Everything talks to an `Npu` through a transport, so the same run executes on the golden model and
(inside the simulation, `sim/rtl/transport.py`) on the SoC's RTL.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npu.config import NpuConfig, get_config
from npu.container import Container, NpuSegment

from ..runtime import Npu
from ..transport import RtlRunner, Transport

#: the default mix: one long convolution, a short MLP, bursts of short convolutions (the design's case)
APPS = ("longconv", "planning", "multipath")
POLICIES = ("expected-time", "count", "round-robin")
RTL_DRAM = 2 << 20  # simulated DRAM of the RTL comparison per copy per engine: every app twice (1.4 MB)


@dataclass
class App:
    name: str
    container: Container  # profiled: every NPU segment has ref_cycles
    x: np.ndarray

    @property
    def work(self) -> int:
        """Reference cycles of one job (the sum over its operators)."""
        return sum(s.ref_cycles or 0 for s in self.container.manifest.segments if isinstance(s, NpuSegment))

    def op_cycles(self) -> list[int]:
        return [s.ref_cycles for s in self.container.manifest.segments if isinstance(s, NpuSegment)]


def build_apps(config: str, names: tuple[str, ...] = APPS, cache: Path | None = None) -> list[App]:
    """The zoo models compiled one operator per segment (cached), profiled alone on the model."""
    from ..demo import compile_zoo
    from ..profile import measure, with_reference_runtimes
    from ..transport import ModelTransport

    cfg = get_config(config).engine
    apps = []
    for name in names:
        c, x = compile_zoo(name, cfg.name, cache, granularity="operator")
        c = with_reference_runtimes(c, measure(ModelTransport(cfg), c, [x]))
        apps.append(App(name, c, x))
    return apps


def poisson_arrivals(
    apps: list[App], engines: int, load: float, jobs: int, seed: int
) -> list[tuple[int, int]]:
    """(cycle, app index) of `jobs` jobs per application: each application's jobs arrive as a Poisson
    process, all at one rate chosen so that the arriving work is `load` x the engines' capacity."""
    rng = np.random.default_rng(seed)
    rate = load * engines / sum(a.work for a in apps)  # jobs per cycle, per application
    out = []
    for i in range(len(apps)):
        t = np.cumsum(rng.exponential(1 / rate, jobs))
        out += [(int(c), i) for c in t]
    return sorted(out)


def run_once(
    transport: Transport | None,
    cfg: NpuConfig,
    apps: list[App],
    arrivals: list[tuple[int, int]],
    policy: str,
    instances: int,
    enqueue: str = "ready",
) -> dict:
    """One run: submit every job at its arrival, drive the device to the end, collect the figures.
    Module level, so `run_on_rtl` can run it inside the simulation (`transport` None: the model)."""
    npu = Npu("model", cfg, transport=transport, dispatch=policy, preempt=False, enqueue=enqueue)
    models = [npu.load(a.container, a.name, instances=instances) for a in apps]
    t0 = npu.tr.now() + 1
    jobs = [(i, models[i].submit(apps[i].x, at=t0 + t, int8=True)) for t, i in arrivals]
    npu.run_all()
    failed = [j for _, j in jobs if j.state != "done"]
    if failed:
        raise RuntimeError(f"{len(failed)} jobs failed, the first: {failed[0].error}")
    end = max(j.finished for _, j in jobs)
    makespan = end - t0
    busy = npu.utilization()
    per_app = []
    for i, a in enumerate(apps):
        lat = np.array([j.latency for k, j in jobs if k == i], dtype=np.float64)
        per_app.append({"name": a.name, "jobs": len(lat), "mean_latency": float(lat.mean()),
                        "p99_latency": float(np.percentile(lat, 99))})  # fmt: skip
    return {
        "engines": cfg.engines,
        "policy": policy,
        "apps": per_app,
        "makespan": int(makespan),
        "engine_utilization": [round(b / makespan, 4) for b in busy],
        "imbalance": round(max(busy) / (sum(busy) / len(busy)), 4) if sum(busy) else 1.0,
        "dma_rd_bytes": int(sum(j.counters["DMA_RD_BYTES"] for _, j in jobs)),
        "dma_wr_bytes": int(sum(j.counters["DMA_WR_BYTES"] for _, j in jobs)),
        "outputs": [[o.tobytes().hex() for o in j.outputs] for _, j in jobs],
    }


def _worst_p99(run: dict) -> float:
    return max(a["p99_latency"] for a in run["apps"])


def bench_opqueue(
    config: str = "default",
    *,
    engines: tuple[int, ...] = (2, 4),
    loads: tuple[float, ...] = (0.5, 0.8, 0.95),
    policies: tuple[str, ...] = POLICIES,
    jobs: int = 100,
    seed: int = 1,
    seeds: int = 1,
    rtl: RtlRunner | None = None,
    rtl_config: str = "default",
    rtl_load: float = 0.8,
    rtl_jobs: int = 4,
    instances: int = 1,
    apps: tuple[str, ...] = APPS,
    cache: Path | None = None,
    progress=None,
) -> dict:
    """Every policy at every load for each engine count on the model, for `seeds` seeds of the
    arrivals from `seed` on (`p99_cut_mean`: each cut's mean over them; with 100 jobs per application
    one seed's p99 is about its second-largest latency); optionally 2 engines on the RTL at one load
    (`rtl_jobs` jobs per application, models compiled for `rtl_config`, seed `seed`). Each model is
    loaded `instances` times per engine: that many of its jobs per engine may be in flight, later
    arrivals wait for a free copy. JSON-ready."""
    say = progress or (lambda msg: None)
    base = get_config(config)
    built = build_apps(base.name, apps, cache)
    runs = []
    cuts = []
    for s in range(seed, seed + seeds):
        runs_s = []
        for n in engines:
            cfg = base.engine.replace(engines=n)
            for load in loads:
                arr = poisson_arrivals(built, n, load, jobs, s)
                for policy in policies:
                    say(f"model: seed {s}, {n} engines, load {load}, {policy}")
                    r = run_once(None, cfg, built, arr, policy, instances=instances * n)
                    r.pop("outputs")
                    runs_s.append({"backend": "model", "load": load, **r, "seed": s})
        cuts.append(_p99_cuts(runs_s))
        runs += runs_s
    result = {
        "config": base.engine.name,
        "apps": [
            {
                "name": a.name,
                "ops": len(a.op_cycles()),
                "job_cycles": a.work,
                "op_cycles_min": min(a.op_cycles()),
                "op_cycles_max": max(a.op_cycles()),
            }
            for a in built
        ],  # fmt: skip
        "jobs_per_app": jobs,
        "instances_per_engine": instances,
        "seed": seed,
        "seeds": list(range(seed, seed + seeds)),
        "runs": runs,
        "p99_cut": cuts[0],  # the first seed's
        "p99_cut_mean": [
            {k: c[k] for k in ("backend", "engines", "load")}
            | {
                "cut": round(float(np.mean([cs[i]["cut"] for cs in cuts])), 4),
                "cuts": [cs[i]["cut"] for cs in cuts],
            }
            for i, c in enumerate(cuts[0])
        ],  # fmt: skip
        "scaling": scaling(built, base, seed, jobs=max(4, jobs // 4), say=say),
    }
    if rtl:
        result["rtl"] = rtl_compare(
            rtl, rtl_config, rtl_load, rtl_jobs, seed, policies, apps, cache, say, instances
        )
        runs += result["rtl"]["runs"]
        result["p99_cut"] += _p99_cuts(result["rtl"]["runs"])
    return result


def _p99_cuts(runs: list[dict]) -> list[dict]:
    """For each (backend, engines, load): the worst application's p99 under expected-time against
    count, and the cut (1 - expected-time / count)."""
    out = []
    keys = sorted({(r["backend"], r["engines"], r["load"]) for r in runs})
    for b, n, load in keys:
        by = {r["policy"]: r for r in runs if (r["backend"], r["engines"], r["load"]) == (b, n, load)}
        if "expected-time" in by and "count" in by:
            e, c = _worst_p99(by["expected-time"]), _worst_p99(by["count"])
            out.append({"backend": b, "engines": n, "load": load, "worst_p99_expected_time": e,
                        "worst_p99_count": c, "cut": round(1 - e / c, 4)})  # fmt: skip
    return out


def scaling(apps: list[App], base: NpuConfig, seed: int, jobs: int, say=lambda m: None) -> dict:
    """Throughput of a saturating load (every job at cycle 0) with 1, 2 and 4 engines."""
    arr = [(0, i) for i in range(len(apps)) for _ in range(jobs)]
    out: dict = {"jobs": len(arr), "policy": "expected-time", "engines": {}}
    first = None
    for n in (1, 2, 4):
        say(f"scaling: {n} engines")
        cfg = base.engine.replace(engines=n)
        r = run_once(None, cfg, apps, arr, "expected-time", instances=n)
        first = first or r["makespan"]
        # the shared port moves one bus word per cycle each way: no makespan is shorter than this
        port = max(r["dma_rd_bytes"], r["dma_wr_bytes"]) / base.bus_bytes
        out["engines"][str(n)] = {
            "makespan": r["makespan"],
            "jobs_per_mcycle": round(len(arr) / r["makespan"] * 1e6, 3),
            "speedup": round(first / r["makespan"], 3),
            "dram_bound_speedup": round(first / port, 3),
        }
    return out


def rtl_compare(
    run_on_rtl: RtlRunner,
    config: str,
    load: float,
    jobs: int,
    seed: int,
    policies,
    apps,
    cache,
    say,
    instances: int = 1,
) -> dict:
    """2 engines at one load on the SoC's RTL (through `run_on_rtl`) and on its golden model: the
    same arrivals."""

    built = build_apps(config, apps, cache)
    cfg = get_config(config).engine.replace(engines=2)
    arr = poisson_arrivals(built, 2, load, jobs, seed)
    runs, agree = [], True
    for policy in policies:
        say(f"rtl: 2 engines, load {load}, {policy} (model, then RTL)")
        m = run_once(None, cfg, built, arr, policy, instances=2 * instances)
        r = run_on_rtl(run_once, cfg, built, arr, policy, 2 * instances, config=cfg,
                       dram_bytes=RTL_DRAM * instances)  # fmt: skip
        agree &= m.pop("outputs") == r.pop("outputs")
        runs.append({"backend": "rtl", "load": load, **r})
        runs.append({"backend": "model-vs-rtl", "load": load, **m,
                     "makespan_error": round(m["makespan"] / r["makespan"] - 1, 4)})  # fmt: skip
    rank = {b: [r["policy"] for r in sorted((r for r in runs if r["backend"] == b), key=_worst_p99)]
            for b in ("rtl", "model-vs-rtl")}  # fmt: skip
    return {"config": cfg.engine.name, "jobs_per_app": jobs, "runs": runs, "bit_exact": agree,
            "rank_rtl": rank["rtl"], "rank_model": rank["model-vs-rtl"],
            "same_rank": rank["rtl"] == rank["model-vs-rtl"]}  # fmt: skip


def format_opqueue(r: dict) -> str:
    lines = [
        f"operator queues on {r['config']}: apps "
        + ", ".join(
            f"{a['name']} ({a['ops']} ops, {a['op_cycles_min']}-{a['op_cycles_max']} cycles each)"
            for a in r["apps"]
        )
    ]
    lines.append(f"{'backend':<13} {'eng':>3} {'load':>5} {'policy':<14} {'worst p99':>11} {'makespan':>11} "
                 f"{'imbalance':>9}  utilisation")  # fmt: skip
    for x in r["runs"]:
        lines.append(f"{x['backend']:<13} {x['engines']:>3} {x['load']:>5} {x['policy']:<14} "
                     f"{_worst_p99(x):>11.0f} {x['makespan']:>11} {x['imbalance']:>9.3f}  "
                     + " ".join(f"{u:.2f}" for u in x["engine_utilization"]))  # fmt: skip
    for c in r["p99_cut"]:
        lines.append(f"{c['backend']} {c['engines']} engines, load {c['load']}: worst p99 expected-time "
                     f"{c['worst_p99_expected_time']:.0f} vs count {c['worst_p99_count']:.0f}: "
                     f"cut {100 * c['cut']:.1f} %")  # fmt: skip
    if len(r.get("seeds", [])) > 1:
        for c in r["p99_cut_mean"]:
            lines.append(f"mean over seeds {r['seeds'][0]}-{r['seeds'][-1]}, {c['engines']} engines, load "
                         f"{c['load']}: cut {100 * c['cut']:.1f} % (" + ", ".join(
                             f"{100 * x:.1f}" for x in c["cuts"]) + ")")  # fmt: skip
    s = r["scaling"]
    lines.append("scaling (saturating load, " + f"{s['jobs']} jobs): " + ", ".join(
        f"{n} engines {v['speedup']}x (DRAM port bound {v['dram_bound_speedup']}x)"
        for n, v in s["engines"].items()))  # fmt: skip
    if "rtl" in r:
        x = r["rtl"]
        lines.append(
            f"RTL (2 engines of {x['config']}): bit-exact {x['bit_exact']}, "
            f"ranking RTL {x['rank_rtl']}, model {x['rank_model']}"
        )
    return "\n".join(lines)
