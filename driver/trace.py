"""A timeline of what the driver did: jobs running, pause requests, stops, dumps, restores, resumes.

Times are device cycles (converted to microseconds at the configuration's nominal clock for the
Chrome trace, which Perfetto and chrome://tracing open) plus the host's wall time of each record.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from npu.files import replacing, write_atomic


def chrome_document(events: list[dict], metadata: dict | None = None) -> dict:
    """The object of a Chrome trace file (Perfetto, chrome://tracing): the one writer of the driver's,
    the pipelines' and the layer-wise scheduler's traces."""
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": metadata or {}}


@dataclass(slots=True)
class Event:
    kind: str  # run, dump, restore, host (spans); submit, pause request, start, resume, done, ... (instants)
    job: int  # job id (-1: the device)
    model: str
    start: int  # cycles
    end: int
    wall: float  # host wall-clock seconds when recorded
    priority: int = 0
    info: str = ""
    engine: int = -1  # the engine it happened on (-1: none, or the host)


@dataclass
class Trace:
    """The last `max_events` events (a long-running service stays bounded; `dropped` counts the
    older ones left out; None keeps every event)."""

    clock_mhz: float = 100.0
    events: list[Event] = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)
    engines: int = 1  # with several, the Chrome trace has one track per engine
    max_events: int | None = 20_000
    dropped: int = 0

    def _add(self, kind: str, job, start: int, end: int, info: str = "", engine: int = -1) -> None:
        jid = -1 if job is None else job.id
        name = "device" if job is None else job.model.name
        prio = 0 if job is None else job.priority
        self.events.append(
            Event(kind, jid, name, start, end, time.perf_counter() - self.t0, prio, info, engine)
        )
        if self.max_events is not None and len(self.events) > self.max_events + self.max_events // 4:
            cut = len(self.events) - self.max_events  # amortised: trim a quarter at a time
            del self.events[:cut]
            self.dropped += cut

    def span(self, kind: str, job, start: int, end: int, info: str = "", engine: int = -1) -> None:
        self._add(kind, job, start, end, info, engine)

    def instant(self, kind: str, job, at: int, info: str = "", engine: int = -1) -> None:
        self._add(kind, job, at, at, info, engine)

    def _track(self, e: Event) -> str:
        if self.engines > 1 and e.engine >= 0:
            return f"engine {e.engine}"
        return f"{e.model} (priority {e.priority})" if e.job >= 0 else "device"

    def spans(self, kind: str | None = None) -> list[Event]:
        return [e for e in self.events if e.end > e.start and (kind is None or e.kind == kind)]

    def to_chrome(self) -> dict:
        us = 1.0 / self.clock_mhz
        out = []
        for e in self.events:
            base = {
                "name": e.kind if e.job < 0 else f"{e.kind} {e.model}#{e.job}",
                "cat": e.kind,
                "pid": 1,
                "tid": self._track(e),
                "ts": e.start * us,
                "args": {
                    "job": e.job,
                    "cycles": [e.start, e.end],
                    "wall_s": round(e.wall, 6),
                    "info": e.info,
                    "engine": e.engine,
                },
            }
            if e.end > e.start:
                out.append({**base, "ph": "X", "dur": (e.end - e.start) * us})
            else:
                out.append({**base, "ph": "i", "s": "t"})
        return chrome_document(out, {"dropped_events": self.dropped} if self.dropped else {})

    def save_chrome(self, path: str | Path) -> None:
        write_atomic(path, json.dumps(self.to_chrome()))

    def save_png(self, path: str | Path, title: str = "NPU timeline") -> None:
        """A Gantt chart: one row per model, bars for runs, dumps and restores, marks for pauses."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = sorted({(e.priority, e.model) for e in self.events if e.job >= 0})
        y = {m: i for i, (_, m) in enumerate(rows)}
        colours = {"run": "tab:blue", "dump": "tab:red", "restore": "tab:green", "host": "tab:gray"}
        fig, ax = plt.subplots(figsize=(12, 1.2 + 0.6 * len(rows)))
        ms = 1e-3 / self.clock_mhz
        for e in self.spans():
            if e.job >= 0 and e.kind in colours:
                ax.broken_barh([(e.start * ms, (e.end - e.start) * ms)], (y[e.model] - 0.35, 0.7),
                               color=colours[e.kind])  # fmt: skip
        for e in self.events:
            if e.kind == "pause request":
                ax.plot(e.start * ms, y[e.model], "kv", ms=5)
        ax.set_yticks(range(len(rows)), [f"{m} (prio {p})" for p, m in rows])
        ax.set_xlabel(f"time (ms at {self.clock_mhz:g} MHz)")
        ax.set_title(title)
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
        ax.legend(handles, list(colours), loc="upper right", ncol=4, fontsize=8)
        fig.tight_layout()
        with replacing(path) as tmp:
            fig.savefig(tmp, dpi=110)
        plt.close(fig)
