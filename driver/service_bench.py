"""`npu bench service`: a long-running device. Many jobs of one small model through one `Npu`;
per window of jobs, the host time per job and the process's resident memory, so that growth with the
number of jobs run (kept records, trace events) shows as a slope."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from .demo import compile_zoo
from .runtime import Npu


def rss_bytes() -> int:
    """The process's resident set now (Linux /proc), else its peak (resource)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def bench_service(
    config: str = "tiny",
    jobs: int = 20_000,
    *,
    model: str = "digits_mlp",
    windows: int = 10,
    history: int = 1000,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run `jobs` jobs of zoo `model` in `windows` equal windows; per window the mean host time per
    job and the RSS at its end. `flat_*` compare the last window with the second (the first warms
    caches up)."""
    container, x = compile_zoo(model, config)
    per = max(1, jobs // windows)
    rows = []
    with Npu("model", config, history=history) as npu:
        m = npu.load(container, model)
        for w in range(windows):
            t = time.perf_counter()
            for _ in range(per):
                m.run(x)
            dt = time.perf_counter() - t
            rows.append(
                {
                    "jobs": (w + 1) * per,
                    "us_per_job": round(dt / per * 1e6, 1),
                    "rss_mb": round(rss_bytes() / 2**20, 1),
                    "job_records": len(npu.jobs),
                    "trace_events": len(npu.trace.events),
                }
            )
            if progress:
                progress(f"{rows[-1]['jobs']}/{per * windows} jobs, {rows[-1]['us_per_job']} us/job")
    ref = rows[min(1, len(rows) - 1)]
    return {
        "config": config,
        "model": model,
        "jobs": per * windows,
        "history": history,
        "windows": rows,
        "time_ratio": round(rows[-1]["us_per_job"] / ref["us_per_job"], 3),
        "rss_ratio": round(rows[-1]["rss_mb"] / ref["rss_mb"], 3),
    }


def format_service(r: dict) -> str:
    lines = [f"{r['jobs']} jobs of {r['model']} on {r['config']} (history {r['history']}):"]
    lines += [
        f"  {w['jobs']:>7} jobs: {w['us_per_job']:>8.1f} us/job, RSS {w['rss_mb']:>7.1f} MB, "
        f"{w['job_records']} job records, {w['trace_events']} trace events"
        for w in r["windows"]
    ]
    lines.append(f"last window / second: time x{r['time_ratio']}, RSS x{r['rss_ratio']}")
    return "\n".join(lines)
