"""The three queue kinds that join stages, bounded, with back-pressure and end of stream.

* `BasicQueue`: producers of one kind; each entry goes to one consumer worker.
* `SyncQueue`: producers of different kinds (stages); an entry is complete when it holds one
  result of each kind for the same frame (stream, seq), and its data is {kind: result}.
* `CopyQueue`: every consumer stage gets its own copy of each entry.

A queue knows how many producer workers feed it; when the last one is done and the queue is drained,
`get` returns None (end of stream) to every consumer worker. `abort` wakes every blocked worker with
`Cancelled`. Depth changes are recorded with their wall time for the pipeline's plots.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque

from .frames import Cancelled, Frame, PipelineError

KINDS = ("basic", "sync", "copy")


class Queue:
    kind = "basic"

    def __init__(self, name: str, maxsize: int = 8):
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise PipelineError(f"queue {name!r}: size must be a positive integer, got {maxsize!r}")
        self.name, self.maxsize = name, maxsize
        self.producers: list[str] = []  # producer stage names (kinds, for a sync queue)
        self.consumers: list[str] = []
        self._cv = threading.Condition()
        self._open = 0  # producer workers not done yet
        self._started = False
        self._aborted = False
        self.puts = 0
        self.gets = 0
        self.depth_log: list[tuple[float, int]] = []
        self.max_depth = 0

    # -- wiring (before the run) ------------------------------------------------------------------
    def add_producer_workers(self, n: int) -> None:
        self._open += n
        self._started = True

    # -- end of stream, abort -----------------------------------------------------------------------
    def producer_done(self) -> None:
        with self._cv:
            self._open -= 1
            if self._open == 0:
                self._on_closed()
            self._cv.notify_all()

    @property
    def closed(self) -> bool:
        return self._started and self._open <= 0

    def abort(self) -> None:
        with self._cv:
            self._aborted = True
            self._cv.notify_all()

    def _on_closed(self) -> None:
        pass

    def _wait(self) -> None:
        if self._aborted:
            raise Cancelled
        self._cv.wait(0.5)
        if self._aborted:
            raise Cancelled

    def _log_depth(self) -> None:
        d = self.depth()
        self.max_depth = max(self.max_depth, d)
        self.depth_log.append((time.perf_counter(), d))

    def _take(self, q: deque[Frame]) -> Frame | None:
        """Under the lock: the head of `q` once there is one; None at the end of the stream."""
        while not q:
            if self.closed:
                return None
            self._wait()
        if self._aborted:
            raise Cancelled
        f = q.popleft()
        self.gets += 1
        self._log_depth()
        self._cv.notify_all()
        return f

    # -- interface ----------------------------------------------------------------------------------
    def depth(self) -> int:
        raise NotImplementedError

    def put(self, frame: Frame, producer: str) -> None:
        raise NotImplementedError

    def get(self, consumer: str) -> Frame | None:
        raise NotImplementedError


class BasicQueue(Queue):
    kind = "basic"

    def __init__(self, name: str, maxsize: int = 8):
        super().__init__(name, maxsize)
        self._q: deque[Frame] = deque()

    def depth(self) -> int:
        return len(self._q)

    def put(self, frame: Frame, producer: str) -> None:
        with self._cv:
            while len(self._q) >= self.maxsize:
                self._wait()
            if self._aborted:
                raise Cancelled
            self._q.append(frame)
            self.puts += 1
            self._log_depth()
            self._cv.notify_all()

    def get(self, consumer: str) -> Frame | None:
        with self._cv:
            return self._take(self._q)


class CopyQueue(Queue):
    """One buffer per consumer stage; a put waits until every consumer has room (the slowest
    consumer sets the pace, and memory stays bounded by size x consumers)."""

    kind = "copy"

    def __init__(self, name: str, maxsize: int = 8):
        super().__init__(name, maxsize)
        self._qs: dict[str, deque[Frame]] = {}

    def depth(self) -> int:
        return max((len(q) for q in self._qs.values()), default=0)

    def _buffers(self) -> dict[str, deque[Frame]]:
        if not self._qs:  # the consumers are known once the pipeline is wired
            self._qs = {c: deque() for c in self.consumers}
        return self._qs

    def put(self, frame: Frame, producer: str) -> None:
        with self._cv:
            self._buffers()
            while any(len(q) >= self.maxsize for q in self._qs.values()):
                self._wait()
            if self._aborted:
                raise Cancelled
            for i, q in enumerate(self._qs.values()):
                data = frame.data if i == 0 else copy.deepcopy(frame.data)
                q.append(Frame(frame.stream, frame.seq, data, frame.t0))
            self.puts += 1
            self._log_depth()
            self._cv.notify_all()

    def get(self, consumer: str) -> Frame | None:
        with self._cv:
            return self._take(self._buffers()[consumer])


class SyncQueue(Queue):
    """Entries keyed by (stream, seq). A result that completes or joins an existing entry never
    waits; one that opens a new entry waits while its kind already holds `size` unconsumed entries,
    so a fast producer runs at most `size` frames ahead of a slow one (size >= the upstream worker
    count keeps reordering from deadlocking it)."""

    kind = "sync"

    def __init__(self, name: str, maxsize: int = 8):
        super().__init__(name, maxsize)
        self._pending: dict[tuple[int, int], Frame] = {}  # partial entries, data = {kind: result}
        self._ready: deque[Frame] = deque()
        self.unmatched: list[Frame] = []

    def depth(self) -> int:
        return len(self._pending) + len(self._ready)

    def _held(self, kind: str) -> int:
        return len(self._ready) + sum(1 for f in self._pending.values() if kind in f.data)

    def put(self, frame: Frame, producer: str) -> None:
        with self._cv:
            entry = self._pending.get(frame.key)
            if entry is None:
                while self._held(producer) >= self.maxsize and frame.key not in self._pending:
                    self._wait()
                entry = self._pending.get(frame.key)
            if self._aborted:
                raise Cancelled
            if entry is None:
                entry = self._pending[frame.key] = Frame(frame.stream, frame.seq, {}, frame.t0)
            if producer in entry.data:
                raise PipelineError(
                    f"sync queue {self.name!r}: {frame.label()} arrived twice from {producer!r}"
                )
            entry.data[producer] = frame.data
            entry.t0 = min(entry.t0, frame.t0)
            if len(entry.data) == len(self.producers):
                del self._pending[frame.key]
                self._ready.append(entry)
            self.puts += 1
            self._log_depth()
            self._cv.notify_all()

    def _on_closed(self) -> None:
        self.unmatched = sorted(self._pending.values(), key=lambda f: f.key)

    def get(self, consumer: str) -> Frame | None:
        with self._cv:
            f = self._take(self._ready)
            if f is None and self.unmatched:
                u = self.unmatched[0]
                raise PipelineError(
                    f"sync queue {self.name!r}: {len(self.unmatched)} frame(s) never got a result "
                    f"from every producer (first: {u.label()} has only {sorted(u.data)} of {self.producers})"
                )
            return f


def make_queue(kind: str, name: str, maxsize: int = 8) -> Queue:
    cls = {"basic": BasicQueue, "sync": SyncQueue, "copy": CopyQueue}.get(kind)
    if cls is None:
        raise PipelineError(f"queue {name!r}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
    return cls(name, maxsize)
