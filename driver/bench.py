"""`npu bench preempt`: what preemption buys in the perception/planning scenario, what every
cancellation point of the perception model costs, and four preemption strategies compared.

Everything here talks to an `Npu` only, so it runs unchanged on every backend (for `rtl`, inside the
simulation: see `sim/rtl/transport.py`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npu.arith import cdiv
from npu.config import NpuConfig

from .demo import DemoModels, run_scenario
from .runtime import LoadedModel, Npu, Priority
from .transport import Transport


def fixed_overhead(cfg: NpuConfig) -> int:
    """The documented fixed overhead of a dump plus a restore (docs/driver.md): per program, its
    fetch, END and the first DMA latency."""
    return 2 * (64 + 2 * cfg.dma_latency)


def drain_bound(container, cfg: NpuConfig) -> int:
    """The drain D of docs/isa.md for a compiled model: the most cycles between the first and the
    last unit passing one cancellation point in an uninterrupted run (golden model timing)."""
    from npu.sim.golden.model import NpuModel
    from npu.sim.golden.runner import point_passes, run_container

    m = NpuModel(cfg, trace=True)
    man = container.manifest
    xs = [np.zeros(t.shape, np.float32) for t in man.inputs]
    run_container(container, xs, cfg, model=m)
    return max([last - first for first, last in point_passes(m.trace).values()] + [0])


def preempt_at_every_point(npu: Npu, low: LoadedModel, x, urgent: LoadedModel, xu) -> tuple[list, list]:
    """Pause `low` at each of its points in turn (the pause is requested as it resumes, the worst
    case), run `urgent` there, resume. Returns (outputs, preemption records)."""
    job = low.submit(x, priority=Priority.LOW, int8=True)
    while True:
        npu.run_until(lambda: job.state == "running" or job.done())
        if job.done():
            break
        npu.pause(job)
        npu.run_until(lambda: job.state == "paused" or job.done())
        if job.done():
            break
        urgent.submit(xu, priority=Priority.HIGH).result()
        npu.resume(job)
    return job.result(), job.preemptions


#: the urgent job's arrivals in the strategies' runs: 20 evenly spaced over the perception run (with
#: four, a change of the program's length moved the means by up to 15 % through where they fell)
ARRIVALS = tuple(float(x) for x in np.arange(1, 40, 2) / 40)
#: on the RTL, where each run is a simulation
RTL_ARRIVALS = (0.2, 0.4, 0.6, 0.8)


def _strategy(new_npu, perception, planning, xp, xq, base_cycles: int, preempt: bool, offsets) -> dict:
    urgent, slow = [], []
    for f in offsets:
        npu = new_npu(preempt)
        p, q = npu.load(perception, "perception"), npu.load(planning, "planning")
        t = npu.tr.now() + 100
        jp = p.submit(xp, priority=Priority.LOW, at=t)
        jq = q.submit(xq, priority=Priority.HIGH, at=t + int(f * base_cycles))
        npu.run_all()
        urgent.append(jq.finished - jq.arrival)
        slow.append((jp.finished - jp.started) / base_cycles - 1)
    return {"urgent_latency": float(np.mean(urgent)), "urgent_latency_max": int(max(urgent)),
            "preempted_slowdown": float(np.mean(slow))}  # fmt: skip


def bench_preempt(
    transport: Callable[[], Transport],
    cfg: NpuConfig,
    models: DemoModels,
    strategies: dict,
    frames: int = 4,
    offsets: tuple[float, ...] = ARRIVALS,
) -> dict:
    """`transport()` gives the device (fresh or reset); `strategies` maps a name to the perception
    container compiled for it (spill points, interval points, naive checkpoint); `offsets`: when
    the urgent job arrives in each strategy's runs, as fractions of the perception run."""

    def new_npu(preempt: bool) -> Npu:
        return Npu(transport=transport(), config=cfg, preempt=preempt)

    non = run_scenario(new_npu(False), models, frames=frames)
    pre = run_scenario(new_npu(True), models, frames=frames)
    npu = new_npu(True)
    low, urgent = npu.load(models.perception, "perception"), npu.load(models.planning, "planning")
    ref = low.run(models.x_perception, int8=True)
    outs, records = preempt_at_every_point(npu, low, models.x_perception, urgent, models.x_planning)
    identical = all(np.array_equal(a, b) for a, b in zip(outs, ref, strict=True))
    points = []
    for r in records:
        points.append(
            {
                "id": r.cp,
                "pause_latency": r.pause_latency,
                "live_bytes": r.live_bytes,
                "dump_cycles": r.dump_cycles,
                "restore_cycles": r.restore_cycles,
                "bound_cycles": 2 * cdiv(r.live_bytes, cfg.bus_bytes),
            }
        )
        points[-1]["within_bound"] = r.dump_cycles + r.restore_cycles <= 1.15 * points[-1][
            "bound_cycles"
        ] + fixed_overhead(cfg)
    pts = models.perception.manifest.cancel_points
    gap = max([p.est_cycles - q.est_cycles for q, p in zip(pts, pts[1:], strict=False)
               if p.segment == q.segment] + [0])  # fmt: skip
    base = new_npu(False)
    b_model = base.load(strategies["spill points"], "perception")
    bj = b_model.submit(models.x_perception)
    bj.result()
    base_cycles = bj.finished - bj.started
    strat = {
        "no preemption": _strategy(
            new_npu,
            strategies["spill points"],
            models.planning,
            models.x_perception,
            models.x_planning,
            base_cycles,
            False,
            offsets,
        )  # fmt: skip
    }
    for name, cont in strategies.items():
        strat[name] = _strategy(
            new_npu, cont, models.planning, models.x_perception, models.x_planning, base_cycles, True, offsets
        )
        strat[name]["points"] = len(cont.manifest.cancel_points)
        strat[name]["max_live_bytes"] = max(p.live_bytes for p in cont.manifest.cancel_points)
    return {
        "config": cfg.name,
        "scenario": {
            "frames": frames,
            "nonpreemptive_latency": non["mean_latency"],
            "preemptive_latency": pre["mean_latency"],
            "reduction": 1 - pre["mean_latency"] / non["mean_latency"],
            "perception_cycles": non["perception_cycles"],
            "period": non["period"],
            "post_cycles": non["post_cycles"],
            "outputs_identical": pre["perception_outputs_identical"],
        },
        "points": points,
        "points_outputs_identical": identical,
        "max_pause_latency": max([p["pause_latency"] for p in points] + [0]),
        "compiler_max_gap": gap,
        "drain_bound": drain_bound(models.perception, cfg),
        "fixed_overhead": fixed_overhead(cfg),
        "strategies": strat,
        "arrivals": len(offsets),
    }


def rtl_bench_preempt(transport, cfg_name: str, models: DemoModels, strategies: dict, frames: int) -> dict:
    """Entry point for `run_on_rtl`: the whole benchmark on one simulated device."""
    from npu.config import get_config

    return bench_preempt(lambda: transport, get_config(cfg_name), models, strategies, frames, RTL_ARRIVALS)


def format_preempt(result: dict) -> str:
    """`bench_preempt`'s figures as text."""
    sc = result["scenario"]
    lines = [
        f"scenario ({sc['frames']} frames): mean latency {sc['nonpreemptive_latency']:,.0f} cycles "
        f"without preemption, {sc['preemptive_latency']:,.0f} with (reduction {sc['reduction']:.1%})",
        f"{len(result['points'])} points: max pause latency {result['max_pause_latency']:,} cycles "
        f"(interval {result['cp_interval']:,}, drain bound {result['drain_bound']:,})",
    ]
    for name, st in result["strategies"].items():
        lines.append(
            f"  {name:<17} urgent latency {st['urgent_latency']:>10,.0f} cycles, "
            f"preempted slowdown {st['preempted_slowdown']:+.1%}"
        )
    return "\n".join(lines)
