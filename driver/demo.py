"""The perception/planning scenario (preemption at cancellation points) on any backend.

Frames arrive every `period` cycles. Each frame runs the long perception CNN, then a host
post-processing step of `post_cycles`, then the short planning MLP. The planning job of frame i
becomes ready while frame i+1's perception is running: without preemption it waits for that
perception to finish; with preemption it pauses it at the next cancellation point, and the
perception job resumes bit-exactly afterwards.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npu.container import Container
from npu.files import tree_digest

from .runtime import Npu, Priority


@dataclass
class DemoModels:
    perception: Container
    planning: Container
    x_perception: np.ndarray
    x_planning: np.ndarray


def _sources_digest() -> str:
    """A digest of the code a compiled model depends on: the compiler, the shared contracts, the
    golden model (the order search's cost model) and the model zoo."""
    import npu

    pkgs = [Path(importlib.import_module(f"npu.{p}").__file__).parent for p in ("compiler", "sim", "models")]
    return tree_digest([*pkgs, *sorted(Path(npu.__file__).parent.glob("*.py"))])


def compile_zoo(
    name: str, config: str, cache: Path | None = None, params: dict | None = None, **opts
) -> tuple[Container, np.ndarray]:
    """A zoo model (built with `params`, e.g. {"layers": 26}) compiled with `opts` and one test
    input. The compiled container is cached in `cache`, keyed by a digest of everything it is built
    from: the ONNX model, the calibration data, the configuration, the options and the compiler's
    sources."""
    import onnx

    from npu.compiler import compile_onnx
    from npu.config import get_config
    from npu.models import zoo

    # the zoo's models are the project's own, checked in int8: their benchmarks measure that datapath
    opts.setdefault("activations", "int8")
    cache = cache or Path("build") / "demo"
    cache.mkdir(parents=True, exist_ok=True)
    z = zoo.ZOO[name](**(params or {}))
    h = hashlib.sha256(z.model.SerializeToString(deterministic=True))
    h.update(np.ascontiguousarray(z.calib, np.float32).tobytes())
    h.update(f"{get_config(config).config_id} {sorted(opts.items())} {_sources_digest()}".encode())
    path = cache / f"{name}-{config}-{h.hexdigest()[:16]}.npub"
    if not path.exists():
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            onnx.save(z.model, str(Path(tmp) / f"{name}.onnx"))
            c = compile_onnx(Path(tmp) / f"{name}.onnx", config, calib=z.calib, **opts).to_container()
            c.save(Path(tmp) / "m.npub")
            os.replace(Path(tmp) / "m.npub", path)  # atomic: a parallel run never reads half a file
    batch = z.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value
    return Container.load(path), z.test[:batch]


def build_models(config: str = "default", cp_interval: int = 20_000, cache: Path | None = None) -> DemoModels:
    """The zoo's perception CNN (with interval points) and planning MLP, compiled (and cached)."""
    p, xp = compile_zoo("perception", config, cache, cp_interval=cp_interval)
    q, xq = compile_zoo("planning", config, cache)
    return DemoModels(p, q, xp, xq)


def strategy_models(config: str = "default", cp_interval: int = 20_000, cache: Path | None = None) -> dict:
    """The perception CNN compiled for each preemption strategy."""
    return {
        "spill points": compile_zoo("perception", config, cache, max_pause_us=0)[0],
        "interval points": compile_zoo("perception", config, cache, cp_interval=cp_interval)[0],
        "naive checkpoint": compile_zoo("perception", config, cache, cp_every_instruction=True)[0],
    }


def run_scenario(
    npu: Npu,
    models: DemoModels,
    *,
    frames: int = 4,
    period: int | None = None,
    post_cycles: int | None = None,
) -> dict:
    """Run the scenario on `npu` (its `preempt` flag decides the mode); per-frame figures."""
    perc = npu.load(models.perception, "perception")
    plan = npu.load(models.planning, "planning")
    alone = perc.submit(models.x_perception, priority=Priority.LOW)
    ref_out = alone.result()
    p_cycles = alone.finished - alone.started
    period = period or int(p_cycles * 1.05)
    post = post_cycles if post_cycles is not None else int(p_cycles * 0.25)
    t0 = npu.tr.now() + 1000
    rows: list[dict] = [{} for _ in range(frames)]
    perc_jobs, plan_jobs = [], []

    def perception_done(i: int):
        def cb(job) -> None:
            rows[i]["perception_done"] = job.finished
            npu.at(
                job.finished + post,
                lambda: plan_jobs.append(
                    plan.submit(models.x_planning, priority=Priority.HIGH, on_done=planning_done(i))
                ),
            )

        return cb

    def planning_done(i: int):
        def cb(job) -> None:
            rows[i]["done"] = job.finished

        return cb

    for i in range(frames):
        rows[i]["arrival"] = t0 + i * period
        perc_jobs.append(
            perc.submit(
                models.x_perception, priority=Priority.LOW, at=t0 + i * period, on_done=perception_done(i)
            )
        )
    npu.run_all()
    for i in range(frames):
        q = plan_jobs[i]
        rows[i].update(
            frame=i,
            latency=rows[i]["done"] - rows[i]["arrival"],
            planning_ready=q.arrival,
            planning_wait=q.started - q.arrival,
        )
    preemptions = [
        {"frame": i, "cp": p.cp, "pause_latency": p.pause_latency, "live_bytes": p.live_bytes,
         "dump_cycles": p.dump_cycles, "restore_cycles": p.restore_cycles}
        for i, j in enumerate(perc_jobs) for p in j.preemptions
    ]  # fmt: skip
    identical = all(
        all(np.array_equal(a, b) for a, b in zip(j.outputs, ref_out, strict=True)) for j in perc_jobs
    )
    return {
        "preemptive": npu.preempt,
        "period": period,
        "post_cycles": post,
        "perception_cycles": p_cycles,
        "frames": rows,
        "preemptions": preemptions,
        "perception_outputs_identical": identical,
        "mean_latency": float(np.mean([r["latency"] for r in rows])),
    }


def format_table(non: dict, pre: dict, clock_mhz: float) -> str:
    ms = 1e-3 / clock_mhz
    lines = [
        f"perception {non['perception_cycles'] * ms:.2f} ms per frame, "
        f"frames every {non['period'] * ms:.2f} ms, "
        f"post-processing {non['post_cycles'] * ms:.2f} ms (at {clock_mhz:g} MHz)",
        "",
        f"{'frame':>5} | {'latency, no preemption':>22} | {'planning waited':>15} | "
        f"{'latency, preemption':>19} "
        f"| {'planning waited':>15} | {'pause':>7} | {'dump':>6} | {'restore':>7}",
        "-" * 120,
    ]
    by_frame = {p["frame"]: p for p in pre["preemptions"]}
    for a, b in zip(non["frames"], pre["frames"], strict=True):
        p = by_frame.get(a["frame"] + 1)  # frame i's planning preempts frame i+1's perception
        extra = (
            f"{p['pause_latency']:>7} | {p['dump_cycles']:>6} | {p['restore_cycles']:>7}"
            if p
            else f"{'-':>7} | {'-':>6} | {'-':>7}"
        )
        lines.append(
            f"{a['frame']:>5} | {a['latency'] * ms:>19.2f} ms | {a['planning_wait'] * ms:>12.2f} ms "
            f"| {b['latency'] * ms:>16.2f} ms | {b['planning_wait'] * ms:>12.2f} ms | {extra}"
        )
    red = 1 - pre["mean_latency"] / non["mean_latency"]
    lines += [
        "-" * 120,
        f"mean end-to-end latency: {non['mean_latency'] * ms:.2f} ms without preemption, "
        f"{pre['mean_latency'] * ms:.2f} ms with preemption (reduction {red:.1%}); "
        "pause/dump/restore in cycles",
        "preempted perception outputs identical to an uninterrupted run: "
        f"{pre['perception_outputs_identical']}",
    ]
    return "\n".join(lines)


def both_modes(
    transport_factory, cfg_name: str, models: DemoModels, frames: int, timing: dict | None = None
) -> tuple[dict, dict, list, list]:
    """The scenario without and with preemption; results and trace events of each. `timing` may
    set `period` and `post_cycles` (default: 1.05x and 0.25x the perception time)."""
    out = []
    for preempt in (False, True):
        npu = Npu(transport=transport_factory(), config=cfg_name, preempt=preempt)
        out.append((run_scenario(npu, models, frames=frames, **(timing or {})), npu.trace))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def rtl_both_modes(transport, cfg_name: str, models: DemoModels, frames: int, timing: dict | None = None):
    """Entry point for `run_on_rtl`: both modes on one simulated device."""
    return both_modes(lambda: transport, cfg_name, models, frames, timing)
