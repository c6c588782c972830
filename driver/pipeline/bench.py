"""`npu bench pipeline`: what the pipeline machinery buys.

* `scaling`: frames/s with 1, 2 and 4 loader workers (processes) when pre-processing is the
  bottleneck (camera frames -> resize, normalise, denoise: 40 ms of CPU per frame -> sink).
* `overlap`: a balanced 3-stage pipeline (pre-processing on the CPU in a process, an accelerator
  wait, a result upload wait; each about the same time per frame) against its slowest stage run
  alone: pipeline frames/s / slowest stage's standalone frames/s.
* `speedup`: the same pipeline against a sequential loop calling the same three stage functions.
* `lost`, `duplicated`: frames over every run of the bench (the pipeline counts them itself).

The waiting stages sleep for their time: they stand for work off the host CPU (an NPU computing,
a network or disk write), which is what a pipeline overlaps with the CPU stages.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .imaging import camera, preprocess
from .pipeline import Pipeline
from .report import Report

HERE = __name__


def frames(n: int, size: int = 160):
    """`n` camera frames (a few distinct ones repeated: the source is not what the bench measures)."""
    it = camera(size)
    distinct = [next(it) for _ in range(min(n, 8))]
    return (distinct[i % len(distinct)] for i in range(n))


def load(frame, size: int = 160, cpu_ms: float = 20.0):
    """Pre-processing that costs `cpu_ms` of CPU time per frame: resize and normalise, then 3x3
    smoothing passes over 16-row bands until the time is spent (small steps, so the cost lands
    within a fraction of a millisecond of `cpu_ms` on any machine and the stages stay balanced)."""
    t = time.process_time()
    x = preprocess(frame, size)
    img = x[0]
    band = 0
    while (time.process_time() - t) * 1e3 < cpu_ms:
        r = (band * 16) % (size - 18)
        win = img[:, r : r + 18]
        img[:, r + 1 : r + 17, 1:-1] = (
            sum(win[:, dy : dy + 16, dx : dx + size - 2] for dy in range(3) for dx in range(3)) / 9.0
        )
        band += 1
    return x


def accelerator(x, ms: float = 20.0):
    time.sleep(ms / 1e3)
    return x


def upload(x, ms: float = 20.0):
    time.sleep(ms / 1e3)
    return x


def discard(x) -> None:
    return None


def _run(p: Pipeline) -> Report:
    return p.run(progress=False)


def _loader_pipeline(n: int, workers: int) -> Pipeline:
    p = Pipeline(name=f"loaders-{workers}")
    p.source("camera", f"{HERE}:frames", args={"n": n})
    p.stage("load", f"{HERE}:load", workers=workers, processes=True, args={"cpu_ms": 40.0})
    p.stage("sink", f"{HERE}:discard")
    p.chain("camera", "load", "sink", size=2 * workers)
    return p


def _balanced(n: int, ms: float, only: str | None = None) -> Pipeline:
    """The balanced 3-stage pipeline (or one of its stages alone)."""
    p = Pipeline(name="balanced" if only is None else only)
    p.source("camera", f"{HERE}:frames", args={"n": n})
    chain = ["camera"]
    if only in (None, "load"):
        p.stage("load", f"{HERE}:load", processes=True, args={"cpu_ms": ms})
        chain.append("load")
    if only in (None, "accelerator"):
        p.stage("accelerator", f"{HERE}:accelerator", args={"ms": ms})
        chain.append("accelerator")
    if only in (None, "upload"):
        p.stage("upload", f"{HERE}:upload", args={"ms": ms})
        chain.append("upload")
    p.stage("sink", f"{HERE}:discard")
    p.chain(*chain, "sink", size=4)
    return p


def _sequential(n: int, ms: float) -> float:
    """Frames/s of a plain loop over the same three stage functions."""
    xs = list(frames(n))
    t = time.perf_counter()
    for x in xs:
        discard(upload(accelerator(load(x, cpu_ms=ms), ms), ms))
    return n / (time.perf_counter() - t)


def _fps(r: Report, stage: str) -> float:
    """Frames/s of `stage` over the run: frames / wall time of the run."""
    return r.stages[stage]["frames"] / r.wall_s


def bench_pipeline(
    frames_n: int = 48, ms: float = 20.0, progress: Callable[[str], None] | None = None
) -> dict:
    say = progress or (lambda _msg: None)
    lost = dup = 0
    scaling = {}
    for w in (1, 2, 4):
        say(f"scaling: {w} loader worker(s)")
        r = _run(_loader_pipeline(frames_n, w))
        lost, dup = lost + r.lost, dup + r.duplicated
        scaling[str(w)] = round(r.throughput, 3)
    standalone = {}
    for stage in ("load", "accelerator", "upload"):
        say(f"overlap: {stage} alone")
        r = _run(_balanced(frames_n, ms, stage))
        lost, dup = lost + r.lost, dup + r.duplicated
        standalone[stage] = round(r.throughput, 3)
    say("overlap: the balanced 3-stage pipeline")
    r = _run(_balanced(frames_n, ms))
    lost, dup = lost + r.lost, dup + r.duplicated
    say("speedup: the sequential loop")
    seq = _sequential(frames_n, ms)
    slowest = min(standalone.values())
    return {
        "frames": frames_n,
        "stage_ms": ms,
        "scaling": {
            "fps": scaling,
            "x2": round(scaling["2"] / scaling["1"], 3),
            "x4": round(scaling["4"] / scaling["1"], 3),
        },
        "standalone_fps": standalone,
        "pipeline_fps": round(r.throughput, 3),
        "sequential_fps": round(seq, 3),
        "overlap": round(r.throughput / slowest, 3),
        "speedup": round(r.throughput / seq, 3),
        "lost": lost,
        "duplicated": dup,
    }


def format_pipeline(res: dict) -> str:
    s = res["scaling"]
    return "\n".join(
        [
            f"scaling (loader workers 1/2/4): {s['fps']['1']:.1f} / {s['fps']['2']:.1f} / "
            f"{s['fps']['4']:.1f} "
            f"frames/s -> x{s['x2']:.2f} with 2, x{s['x4']:.2f} with 4",
            f"balanced 3 stages of ~{res['stage_ms']:.0f} ms: standalone {res['standalone_fps']}, pipeline "
            f"{res['pipeline_fps']:.1f} frames/s -> overlap {res['overlap']:.2f}",
            f"sequential loop {res['sequential_fps']:.1f} frames/s -> speedup x{res['speedup']:.2f}",
            f"frames lost {res['lost']}, duplicated {res['duplicated']}",
        ]
    )
