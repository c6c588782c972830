"""A pipeline: stages joined by queues, run by worker threads (and process pools), with end of
stream, bounded stopping on errors and Ctrl-C, and frame accounting."""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import networkx as nx

from ..runtime import LoadedModel, Npu, Priority
from .frames import Cancelled, Frame, PipelineError, StageError
from .queues import Queue, SyncQueue, make_queue
from .report import Report, Span
from .stages import ModelRunner, Source, Stage

STOP_GRACE_S = 10.0  # how long stopping waits for a worker stuck in user code
NPU_QUANTUM = 10_000  # device cycles per driver step while runners share the device


class Pipeline:
    """Build with `source`, `stage`, `runner` and `queue`, then `run()`:

    p = Pipeline(npu)
    p.source("camera", "stages:camera", frames=100)
    p.stage("load", "stages:preprocess", workers=2, processes=True)
    p.runner("detect", npu.load("perception.npub"), priority=Priority.LOW)
    p.stage("post", "stages:postprocess")
    p.chain("camera", "load", "detect", "post")   # basic queues between consecutive stages
    report = p.run()
    """

    def __init__(self, npu: Npu | None = None, *, name: str = "pipeline", paths: list[str] | None = None):
        self.npu, self.name = npu, name
        self.stages: dict[str, Stage] = {}
        self.queues: dict[str, Queue] = {}
        self.paths = list(paths or [])  # import paths of the stage modules (for process workers)
        self._stop = threading.Event()
        self._errors: list[PipelineError] = []
        self._lock = threading.Lock()
        self.spans: list[Span] = []
        self.emitted: dict[str, list[tuple[int, int]]] = defaultdict(list)  # source -> keys
        self.received: dict[str, list[tuple[int, int]]] = defaultdict(list)  # sink -> keys
        self.latencies: dict[str, list[float]] = defaultdict(list)  # sink -> end-to-end seconds

    # -- building ---------------------------------------------------------------------------------
    def _add(self, st: Stage) -> Stage:
        if st.name in self.stages or st.name in self.queues:
            raise PipelineError(f"stage {st.name!r}: the name is already used")
        st.paths = self.paths
        self.stages[st.name] = st
        return st

    def source(
        self,
        name: str,
        fn: str | Callable,
        *,
        frames: int | None = None,
        stream: int | None = None,
        args: dict | None = None,
    ) -> Source:
        n = sum(isinstance(s, Source) for s in self.stages.values())
        return self._add(
            Source(name, fn, args=dict(args or {}), frames=frames, stream=n if stream is None else stream)
        )

    def stage(
        self,
        name: str,
        fn: str | Callable,
        *,
        workers: int = 1,
        processes: bool = False,
        ordered: bool = False,
        args: dict | None = None,
    ) -> Stage:
        return self._add(Stage(name, fn, workers, processes, ordered, dict(args or {})))

    def runner(
        self,
        name: str,
        model: LoadedModel,
        *,
        priority: int = Priority.NORMAL,
        workers: int = 1,
        int8: bool = False,
        ordered: bool = False,
    ) -> ModelRunner:
        if self.npu is None:
            self.npu = model.npu
        elif model.npu is not self.npu:
            raise PipelineError(f"runner {name!r}: its model is loaded on another Npu than the pipeline's")
        return self._add(
            ModelRunner(name, None, workers, ordered=ordered, model=model, priority=int(priority), int8=int8)
        )

    def queue(
        self, name: str, kind: str = "basic", size: int = 8, *, producers: list[str], consumers: list[str]
    ) -> Queue:
        if name in self.queues or name in self.stages:
            raise PipelineError(f"queue {name!r}: the name is already used")
        q = make_queue(kind, name, size)
        q.producers, q.consumers = list(producers), list(consumers)
        self.queues[name] = q
        return q

    def chain(self, *names: str, size: int = 8) -> None:
        """Basic queues between consecutive stages."""
        for a, b in zip(names, names[1:], strict=False):
            self.queue(f"{a}->{b}", "basic", size, producers=[a], consumers=[b])

    # -- validation -------------------------------------------------------------------------------
    def graph(self) -> nx.DiGraph:
        g = nx.DiGraph()
        g.add_nodes_from(self.stages)
        for q in self.queues.values():
            g.add_edges_from((p, c) for p in q.producers for c in q.consumers)
        return g

    def validate(self) -> None:
        """Check the wiring; every problem is a PipelineError naming the stage or queue."""
        if not any(isinstance(s, Source) for s in self.stages.values()):
            raise PipelineError("the pipeline has no source")
        for s in self.stages.values():
            s.input = s.output = None
        for q in self.queues.values():
            if not q.producers:
                raise PipelineError(f"queue {q.name!r} has no producer")
            if not q.consumers:
                raise PipelineError(f"queue {q.name!r} has no consumer")
            for role, names in (("producer", q.producers), ("consumer", q.consumers)):
                if len(set(names)) != len(names):
                    raise PipelineError(f"queue {q.name!r}: a {role} is listed twice: {names}")
                for n in names:
                    if n not in self.stages:
                        known = ", ".join(sorted(self.stages)) or "none"
                        raise PipelineError(f"queue {q.name!r}: unknown stage {n!r} (stages: {known})")
            for n in q.producers:
                st = self.stages[n]
                if st.output is not None:
                    raise PipelineError(
                        f"stage {n!r} produces into two queues ({st.output.name!r}, {q.name!r}); "
                        "use one copy queue to feed several consumers"
                    )
                st.output = q
            for n in q.consumers:
                st = self.stages[n]
                if isinstance(st, Source):
                    raise PipelineError(f"queue {q.name!r}: source {n!r} cannot consume a queue")
                if st.input is not None:
                    raise PipelineError(
                        f"stage {n!r} consumes two queues ({st.input.name!r}, {q.name!r}); "
                        "join them with a sync queue"
                    )
                st.input = q
        for s in self.stages.values():
            if not isinstance(s, Source) and s.input is None:
                raise PipelineError(f"stage {s.name!r} has no input queue (and is not a source)")
            s.check()
        g = self.graph()
        try:
            cycle = nx.find_cycle(g)
        except nx.NetworkXNoCycle:
            cycle = None
        if cycle:
            raise PipelineError(
                "the pipeline has a cycle: " + " -> ".join([a for a, _ in cycle] + [cycle[0][0]])
            )
        for q in self.queues.values():
            if isinstance(q, SyncQueue):
                if len(q.producers) < 2:
                    raise PipelineError(
                        f"sync queue {q.name!r} is fed by one kind only ({q.producers}); a sync queue joins "
                        "results of different producers (use a basic queue)"
                    )
                srcs = {p: self._sources_of(g, p) for p in q.producers}
                if len({frozenset(v) for v in srcs.values()}) > 1:
                    raise PipelineError(
                        f"sync queue {q.name!r}: its producers see different sources "
                        f"({ {p: sorted(v) for p, v in srcs.items()} }), so their frames never match"
                    )

    def _sources_of(self, g: nx.DiGraph, name: str) -> set[str]:
        return {n for n in nx.ancestors(g, name) | {name} if isinstance(self.stages[n], Source)}

    # -- running ----------------------------------------------------------------------------------
    def _fail(self, err: PipelineError) -> None:
        with self._lock:
            self._errors.append(err)
        self.abort()

    def abort(self) -> None:
        """Stop every worker (blocked ones wake with Cancelled)."""
        self._stop.set()
        for q in self.queues.values():
            q.abort()

    def _worker(self, st: Stage, idx: int) -> None:
        frame: Frame | None = None
        try:
            if isinstance(st, Source):
                it = iter(st.iterate())
                for seq in itertools.count():
                    t = time.perf_counter()
                    try:
                        data = next(it)
                    except StopIteration:
                        break
                    if self._stop.is_set():
                        raise Cancelled
                    frame = Frame(st.stream, seq, data)
                    self.emitted[st.name].append(frame.key)
                    self.spans.append(Span(st.name, idx, frame.key, t, frame.t0))
                    if st.output is not None:
                        st.output.put(frame, st.name)
                    else:
                        self._sink(st, frame)
                frame = None
                return
            call, close = st.make_call(self._stop)
            try:
                while True:
                    frame = st.next_frame()
                    if frame is None:
                        return
                    t = time.perf_counter()
                    out = call(frame.data)
                    self.spans.append(Span(st.name, idx, frame.key, t, time.perf_counter()))
                    if st.output is not None:
                        st.output.put(Frame(frame.stream, frame.seq, out, frame.t0), st.name)
                    else:
                        self._sink(st, frame)
            finally:
                close()
        except Cancelled:
            pass
        except PipelineError as e:
            self._fail(e)
        except BaseException as e:  # noqa: BLE001 - any error of user code stops the pipeline
            self._fail(StageError(st.name, frame, e))
        finally:
            if st.output is not None:
                st.output.producer_done()

    def _sink(self, st: Stage, frame: Frame) -> None:
        self.received[st.name].append(frame.key)
        self.latencies[st.name].append(time.perf_counter() - frame.t0)

    def run(self, *, progress: bool | None = None, timeout_s: float | None = None) -> Report:
        """Run until the sources are exhausted and the queues drained; raises the first stage's
        error (a PipelineError naming the stage and frame), or KeyboardInterrupt after stopping
        cleanly on Ctrl-C."""
        self.validate()
        if self.npu is not None and self.npu.wait_quantum is None:
            self.npu.wait_quantum = NPU_QUANTUM  # submissions of other runners get in mid-job
        progress = sys.stderr.isatty() if progress is None else progress
        for q in self.queues.values():
            q.add_producer_workers(sum(self.stages[p].workers for p in q.producers))
        started: list[Stage] = []
        threads: list[threading.Thread] = []
        t0 = time.perf_counter()
        try:
            for st in self.stages.values():
                st.start()
                started.append(st)
            t0 = time.perf_counter()
            for st in self.stages.values():
                for i in range(st.workers):
                    t = threading.Thread(
                        target=self._worker, args=(st, i), name=f"{st.name}/{i}", daemon=True
                    )
                    threads.append(t)
            for t in threads:
                t.start()
            self._supervise(threads, t0, progress, timeout_s)
        except KeyboardInterrupt:
            self.abort()
            self._join(threads)
            raise
        finally:
            for st in started:
                st.stop()
            if progress:
                print(file=sys.stderr)
        wall = time.perf_counter() - t0
        if self._errors:
            raise self._errors[0]
        report = Report.build(self, wall)
        if report.lost or report.duplicated:
            raise PipelineError(
                f"frames went missing or were doubled: lost {report.lost}, duplicated {report.duplicated}"
            )
        return report

    def _supervise(self, threads: list[threading.Thread], t0: float, progress: bool, timeout_s: float | None):
        expected = self._expected_frames()
        last = 0.0
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.1)
                if self._stop.is_set() or not t.is_alive():
                    break
            if self._stop.is_set():
                self._join(threads)
                return
            now = time.perf_counter()
            if timeout_s is not None and now - t0 > timeout_s:
                self._fail(PipelineError(f"the pipeline did not finish within {timeout_s} s"))
                self._join(threads)
                return
            if progress and now - last > 0.5:
                last = now
                done = sum(len(v) for v in self.received.values())
                tail = f"/{expected}" if expected else ""
                print(
                    f"\rpipeline {self.name}: {done}{tail} frames at the sinks, {now - t0:.1f} s",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )

    def _join(self, threads: list[threading.Thread]) -> None:
        end = time.perf_counter() + STOP_GRACE_S
        for t in threads:
            t.join(max(0.0, end - time.perf_counter()))
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            self._errors.append(
                PipelineError(
                    f"worker(s) {', '.join(stuck)} did not stop within {STOP_GRACE_S} s "
                    "(stuck in a stage function)"
                )
            )

    def _expected_frames(self) -> int | None:
        """Frames the sinks should see when every source gives `frames` (None: unknown)."""
        g = self.graph()
        total = 0
        for name, st in self.stages.items():
            if st.output is None:
                srcs = [self.stages[s] for s in self._sources_of(g, name)]
                if any(s.frames is None for s in srcs):
                    return None
                total += sum(s.frames for s in srcs)
        return total

    # -- accounting -------------------------------------------------------------------------------
    def frame_counts(self) -> tuple[int, int]:
        """(lost, duplicated) over every sink: each sink should see each frame of the sources
        upstream of it exactly once."""
        g = self.graph()
        lost = dup = 0
        for name, st in self.stages.items():
            if st.output is not None:
                continue
            want: set[tuple[int, int]] = set()
            for s in self._sources_of(g, name):
                want |= set(self.emitted[s])
            got = Counter(self.received[name])
            lost += len(want - set(got))
            dup += sum(n - 1 for n in got.values() if n > 1) + sum(n for k, n in got.items() if k not in want)
        return lost, dup

    def describe(self) -> dict[str, Any]:
        return {
            "stages": {
                n: {"kind": s.kind, "workers": s.workers, "processes": s.processes}
                for n, s in self.stages.items()
            },
            "queues": {
                n: {"kind": q.kind, "size": q.maxsize, "producers": q.producers, "consumers": q.consumers}
                for n, q in self.queues.items()
            },
        }
