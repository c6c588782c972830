"""Stages: a source (produces the frames of one stream), a worker stage (a function over each
frame's data, run by N threads or N processes) and a model runner (inference on a shared `Npu`)."""

from __future__ import annotations

import functools
import inspect
import multiprocessing
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..resolve import resolve as resolve_path
from .frames import Cancelled, Frame, PipelineError
from .queues import Queue

MAX_WORKERS = 64  # per stage: more threads or processes than this only exhaust the host


def check_workers(n: Any, where: str) -> None:
    """A stage's worker count: a positive integer up to MAX_WORKERS."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise PipelineError(f"{where}workers must be a positive integer, got {n!r}")
    if n > MAX_WORKERS:
        raise PipelineError(f"{where}workers {n} is above the maximum of {MAX_WORKERS} per stage")


def resolve(ref: str | Callable, where: str = "") -> Callable:
    """`module:attr` (or `module.attr`) -> the object; a callable is returned as is."""
    return resolve_path(ref, where, PipelineError)


# -- process workers --------------------------------------------------------------------------------
_proc_cache: dict[tuple, Callable] = {}


def _proc_init(paths: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)


def _proc_call(ref: str | Callable, args: dict, data: Any) -> Any:
    key = (ref if isinstance(ref, str) else id(ref), tuple(sorted(args)))
    fn = _proc_cache.get(key)
    if fn is None:
        fn = _proc_cache[key] = functools.partial(resolve(ref), **args)
    return fn(data)


def _proc_ready(ref: str | Callable) -> None:
    resolve(ref)  # imports the stage's module in the worker process before the clock starts


@dataclass(eq=False)
class Stage:
    """A named step. `fn` is an import path or a callable: a function `fn(data, **args) -> data`,
    or (thread workers only) a class instantiated once per worker as `cls(**args)` whose instances
    are called on each frame's data (and whose `close()`, if any, is called at the end).

    `processes=True` runs each call in a pool of `workers` processes (CPU-bound Python), so the
    function must be importable. `ordered=True` hands each stream's frames to the stage in sequence
    order (with one worker, its outputs keep that order too)."""

    name: str
    fn: str | Callable | None = None
    workers: int = 1
    processes: bool = False
    ordered: bool = False
    args: dict = field(default_factory=dict)
    kind: str = "stage"  # stage, source, runner
    input: Queue | None = None
    output: Queue | None = None
    paths: list[str] = field(default_factory=list)  # extra import paths for process workers
    _pool: ProcessPoolExecutor | None = None
    _reorder: Reorder | None = None

    def check(self) -> None:
        where = f"stage {self.name!r}: "
        check_workers(self.workers, where)
        if self.kind == "stage":
            target = resolve(self.fn, where)
            if self.processes and inspect.isclass(target):
                raise PipelineError(f"{where}a class cannot run in process workers; give a function")
            if self.processes and getattr(target, "__qualname__", "").count("<locals>"):
                raise PipelineError(f"{where}process workers need a module-level function")

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self.ordered:
            self._reorder = Reorder(self)
        if self.kind == "stage" and self.processes:
            ctx = multiprocessing.get_context("forkserver" if sys.platform != "win32" else "spawn")
            self._pool = ProcessPoolExecutor(
                self.workers, mp_context=ctx, initializer=_proc_init, initargs=(list(self.paths),)
            )
            for f in [self._pool.submit(_proc_ready, self.fn) for _ in range(self.workers)]:
                f.result()

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def next_frame(self) -> Frame | None:
        if self._reorder is not None:
            return self._reorder.get()
        return self.input.get(self.name)

    def make_call(self, stop: threading.Event) -> tuple[Callable[[Any], Any], Callable[[], None]]:
        """A worker's function over one frame's data, and what to call when the worker ends."""
        if self.processes:
            pool = self._pool

            def call(data: Any) -> Any:
                fut = pool.submit(_proc_call, self.fn, self.args, data)
                while True:
                    try:
                        return fut.result(timeout=0.2)
                    except FutureTimeout:
                        if stop.is_set():
                            fut.cancel()
                            raise Cancelled from None

            return call, lambda: None
        target = resolve(self.fn)
        if inspect.isclass(target):
            obj = target(**self.args)
            return obj, getattr(obj, "close", lambda: None)
        return functools.partial(target, **self.args), lambda: None


@dataclass(eq=False)
class Source(Stage):
    """Produces one stream: `fn(**args)` returns an iterable of payloads; at most `frames` of them
    are taken. Frames are numbered 0, 1, ... in stream `stream`."""

    kind: str = "source"
    stream: int = 0
    frames: int | None = None

    def check(self) -> None:
        if self.workers != 1:
            raise PipelineError(f"source {self.name!r}: a source has one worker (got {self.workers})")
        resolve(self.fn, f"source {self.name!r}: ")
        if self.frames is not None and (not isinstance(self.frames, int) or self.frames < 0):
            raise PipelineError(f"source {self.name!r}: frames must be >= 0, got {self.frames!r}")

    def iterate(self) -> Iterable[Any]:
        it = resolve(self.fn)(**self.args)
        if not isinstance(it, Iterable):
            raise PipelineError(
                f"source {self.name!r}: {self.fn!r} returned {type(it).__name__}, not an iterable"
            )
        for i, data in enumerate(it):
            if self.frames is not None and i >= self.frames:
                return
            yield data


@dataclass(eq=False)
class ModelRunner(Stage):
    """Inference on the pipeline's `Npu`: each frame's data (an array, or a list of arrays for a
    model of several inputs) becomes a job at `priority`; its data becomes the outputs (one array,
    or a list). Runners of different priorities share the device, so an urgent runner's jobs
    preempt the others' at their cancellation points."""

    kind: str = "runner"
    model: Any = None  # a LoadedModel
    priority: int = 0
    int8: bool = False
    jobs: list = field(default_factory=list)

    def check(self) -> None:
        if self.model is None:
            raise PipelineError(f"runner {self.name!r}: no model")
        check_workers(self.workers, f"runner {self.name!r}: ")

    def make_call(self, stop: threading.Event) -> tuple[Callable[[Any], Any], Callable[[], None]]:
        model, npu = self.model, self.model.npu

        def call(data: Any) -> Any:
            xs = list(data) if isinstance(data, list | tuple) else [data]
            job = model.submit(*[np.asarray(x) for x in xs], priority=self.priority, int8=self.int8)
            self.jobs.append(job)
            npu.run_until(lambda: job.done() or stop.is_set())
            if not job.done():
                raise Cancelled
            if job.error is not None:
                raise job.error
            return job.outputs[0] if len(job.outputs) == 1 else list(job.outputs)

        return call, lambda: None


class Reorder:
    """Hands a stage its input in per-stream sequence order (frames that come early wait)."""

    def __init__(self, stage: Stage):
        self.stage = stage
        self.lock = threading.Lock()
        self.next: dict[int, int] = {}
        self.held: dict[tuple[int, int], Frame] = {}
        self.ended = False

    def _ready(self) -> Frame | None:
        for s, n in self.next.items():
            f = self.held.pop((s, n), None)
            if f is not None:
                self.next[s] = n + 1
                return f
        return None

    def get(self) -> Frame | None:
        with self.lock:  # one worker pulls at a time; others wait for their turn here
            while True:
                f = self._ready()
                if f is not None:
                    return f
                if self.ended:
                    if not self.held:
                        return None
                    key = min(self.held)  # a gap upstream: go on with what is left, in order
                    self.next[key[0]] = key[1]
                    continue
                f = self.stage.input.get(self.stage.name)
                if f is None:
                    self.ended = True
                    continue
                self.next.setdefault(f.stream, 0)
                self.held[f.key] = f
