"""Progress of a compile, stage by stage (`npu compile` prints it on a terminal): the passes call
`stage`, which reports to the callback `compile_onnx(progress=...)` set for this compile."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_SINK: ContextVar[tuple[Callable[[str], None], float] | None] = ContextVar("compile_progress", default=None)


@contextmanager
def reporting(progress: Callable[[str], None] | None) -> Iterator[None]:
    """Stages reported to `progress` (None: to nobody) inside this block."""
    token = _SINK.set((progress, time.perf_counter()) if progress else None)
    try:
        yield
    finally:
        _SINK.reset(token)


def stage(what: str) -> None:
    """Say that a stage starts, with the seconds since the compile started."""
    sink = _SINK.get()
    if sink is not None:
        say, t0 = sink
        say(f"{time.perf_counter() - t0:6.1f} s  {what}")
