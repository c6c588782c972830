"""What a pipeline run measured: per-stage throughput and latency percentiles, queue depths over
time, frame accounting, the NPU's jobs; as JSON, a Perfetto (Chrome) trace with one track per worker
next to the device's own trace, and a PNG of queue depths and stage occupancy."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from npu.files import replacing, write_atomic

from ..trace import chrome_document

if TYPE_CHECKING:
    from .pipeline import Pipeline


@dataclass
class Span:
    stage: str
    worker: int
    frame: tuple[int, int]
    start: float  # perf_counter seconds
    end: float


def _pct(xs: list[float], scale: float = 1e3) -> dict[str, float]:
    """Percentiles of `xs` (seconds, reported in ms by default)."""
    if not xs:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0, "mean": 0.0}
    a = np.asarray(xs, dtype=float) * scale
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return {
        "p50": round(float(p50), 3),
        "p95": round(float(p95), 3),
        "p99": round(float(p99), 3),
        "mean": round(float(a.mean()), 3),
    }


@dataclass
class Report:
    wall_s: float
    frames: int  # emitted by the sources
    lost: int
    duplicated: int
    stages: dict[str, dict[str, Any]]
    queues: dict[str, dict[str, Any]]
    sinks: dict[str, dict[str, Any]]
    npu: dict[str, Any] | None
    t0: float = 0.0
    spans: list[Span] = field(default_factory=list, repr=False)
    depth_logs: dict[str, list[tuple[float, int]]] = field(default_factory=dict, repr=False)
    device_trace: Any = field(default=None, repr=False)

    @property
    def throughput(self) -> float:
        """Frames per second at the sinks."""
        n = sum(s["frames"] for s in self.sinks.values())
        return n / self.wall_s if self.wall_s > 0 else 0.0

    @classmethod
    def build(cls, p: Pipeline, wall: float) -> Report:
        spans = list(p.spans)
        t0 = min((s.start for s in spans), default=0.0)
        stages = {}
        for name, st in p.stages.items():
            mine = [s for s in spans if s.stage == name]
            busy = sum(s.end - s.start for s in mine)
            span_s = (max(s.end for s in mine) - min(s.start for s in mine)) if mine else 0.0
            stages[name] = {
                "kind": st.kind,
                "workers": st.workers,
                "processes": st.processes,
                "frames": len(mine),
                "throughput_fps": round(len(mine) / span_s, 3) if span_s > 0 else 0.0,
                "latency_ms": _pct([s.end - s.start for s in mine]),
                "occupancy": round(busy / (wall * st.workers), 4) if wall > 0 else 0.0,
            }
        queues = {
            n: {
                "kind": q.kind,
                "size": q.maxsize,
                "puts": q.puts,
                "gets": q.gets,
                "max_depth": q.max_depth,
                "mean_depth": round(float(np.mean([d for _, d in q.depth_log])), 3) if q.depth_log else 0.0,
            }
            for n, q in p.queues.items()
        }
        sinks = {
            n: {"frames": len(p.received[n]), "latency_ms": _pct(p.latencies[n])}
            for n, st in p.stages.items()
            if st.output is None
        }
        lost, dup = p.frame_counts()
        npu = None
        runners = [st for st in p.stages.values() if st.kind == "runner"]
        if runners:
            npu = {
                r.name: {
                    "priority": r.priority,
                    "jobs": len(r.jobs),
                    "preemptions": sum(len(j.preemptions) for j in r.jobs),
                    "device_latency_cycles": _pct([j.latency for j in r.jobs if j.latency is not None], 1),
                }
                for r in runners
            }
        return cls(
            wall,
            sum(len(v) for v in p.emitted.values()),
            lost,
            dup,
            stages,
            queues,
            sinks,
            npu,
            t0,
            spans,
            {n: list(q.depth_log) for n, q in p.queues.items()},
            p.npu.trace if runners and p.npu else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 4),
            "frames": self.frames,
            "throughput_fps": round(self.throughput, 3),
            "lost": self.lost,
            "duplicated": self.duplicated,
            "stages": self.stages,
            "queues": self.queues,
            "sinks": self.sinks,
            "npu": self.npu,
        }

    def summary(self) -> str:
        lines = [
            f"{self.frames} frames in {self.wall_s:.2f} s ({self.throughput:.1f} frames/s at the sinks), "
            f"lost {self.lost}, duplicated {self.duplicated}",
            f"{'stage':<16}{'workers':>8}{'frames':>8}{'fps':>10}{'p50 ms':>10}{'p99 ms':>10}{'busy':>7}",
        ]
        for n, s in self.stages.items():
            lat = s["latency_ms"]
            lines.append(
                f"{n:<16}{s['workers']:>8}{s['frames']:>8}{s['throughput_fps']:>10.1f}"
                f"{lat['p50']:>10.2f}{lat['p99']:>10.2f}{s['occupancy']:>7.0%}"
            )
        for n, q in self.queues.items():
            lines.append(
                f"queue {n} ({q['kind']}, size {q['size']}): max depth {q['max_depth']}, "
                f"mean {q['mean_depth']}"
            )
        for n, r in (self.npu or {}).items():
            lines.append(
                f"runner {n} (priority {r['priority']}): {r['jobs']} jobs, {r['preemptions']} preemptions"
            )
        return "\n".join(lines)

    # -- pictures ---------------------------------------------------------------------------------
    def to_chrome(self) -> dict:
        """Worker spans (wall time, process 'pipeline', one track per worker) and the NPU's device
        trace (process 'NPU', device time at the nominal clock) in one Perfetto-readable trace."""
        ev: list[dict] = [
            {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "pipeline (wall time)"}}
        ]
        for s in self.spans:
            ev.append(
                {
                    "name": s.stage,
                    "cat": "stage",
                    "ph": "X",
                    "pid": 1,
                    "tid": f"{s.stage}/{s.worker}",
                    "ts": (s.start - self.t0) * 1e6,
                    "dur": (s.end - s.start) * 1e6,
                    "args": {"stream": s.frame[0], "seq": s.frame[1]},
                }
            )
        for name, log in self.depth_logs.items():
            for t, d in log:
                ev.append(
                    {
                        "name": f"queue {name}",
                        "ph": "C",
                        "pid": 1,
                        "ts": (t - self.t0) * 1e6,
                        "args": {"depth": d},
                    }
                )
        if self.device_trace is not None:
            ev.append(
                {
                    "ph": "M",
                    "name": "process_name",
                    "pid": 2,
                    "args": {"name": "NPU (device cycles at the nominal clock)"},
                }
            )
            for e in self.device_trace.to_chrome()["traceEvents"]:
                ev.append({**e, "pid": 2})
        return chrome_document(ev)

    def save_chrome(self, path: str | Path) -> None:
        write_atomic(path, json.dumps(self.to_chrome()))

    def save_png(self, path: str | Path, title: str = "pipeline") -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
        for name, log in self.depth_logs.items():
            if log:
                ts = [t - self.t0 for t, _ in log]
                ax1.step(ts, [d for _, d in log], where="post", label=name)
        ax1.set_ylabel("queue depth")
        ax1.legend(loc="upper right", fontsize="small")
        end = max((s.end for s in self.spans), default=self.t0) - self.t0
        grid = np.linspace(0, max(end, 1e-6), 400)
        for name, st in self.stages.items():
            mine = [s for s in self.spans if s.stage == name]
            busy = np.zeros_like(grid)
            for s in mine:
                busy += (grid >= s.start - self.t0) & (grid < s.end - self.t0)
            ax2.plot(grid, busy / st["workers"], label=f"{name} ({st['workers']})")
        ax2.set_ylabel("stage occupancy")
        ax2.set_xlabel("wall time (s)")
        ax2.set_ylim(-0.05, 1.05)
        ax2.legend(loc="upper right", fontsize="small")
        fig.suptitle(title)
        fig.tight_layout()
        with replacing(path) as tmp:
            fig.savefig(tmp, dpi=100)
        plt.close(fig)
