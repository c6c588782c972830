"""What flows through a pipeline: frames (a payload with its stream and sequence number) and the
errors a pipeline raises."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from npu.errors import NpuError


@dataclass
class Frame:
    """One item of one stream. `seq` counts from 0 per stream; `t0` is the wall time (perf_counter)
    at which its source produced it, for end-to-end latency."""

    stream: int
    seq: int
    data: Any
    t0: float = field(default_factory=time.perf_counter)

    @property
    def key(self) -> tuple[int, int]:
        return (self.stream, self.seq)

    def label(self) -> str:
        return f"stream {self.stream} frame {self.seq}"


class PipelineError(NpuError, RuntimeError):
    """A pipeline failed: a stage raised, the description is invalid, or frames went missing."""


class StageError(PipelineError):
    """A stage's function raised on a frame; names the stage and the frame."""

    def __init__(self, stage: str, frame: Frame | None, err: BaseException):
        where = f" on {frame.label()}" if frame is not None else ""
        super().__init__(f"stage {stage!r} failed{where}: {type(err).__name__}: {err}")
        self.stage, self.frame, self.error = stage, frame, err


class Cancelled(Exception):
    """Raised inside workers blocked on a queue when the pipeline stops (an error elsewhere,
    Ctrl-C); never escapes the pipeline."""
