"""Work in a second process, beside the compiler's own, on machines with two or more cores.

Two steps of a compile do not depend on what runs at the same time:

- the accuracy check's golden-model runs (`golden_runs`) and the order search and final assembly
  of the build the check is likely to accept (compiler/compile.py); the child first times the
  checked build's segments (`segment_times`), which the final assembly's first build is where the
  search keeps the ONNX order (`assemble.Reuse`);
- the int16-everywhere quantisation (onnxruntime's quantiser) and the int8/int16 choice's test of
  whether the calibration outputs respond to int8 noise, after which most models keep int16
  everywhere (compiler/precision.py).

The second process is a child Python (`python -m npu.compiler.parallel`: a subprocess rather than
multiprocessing, so a caller's script without a `__main__` guard is not imported again, and no
thread of onnxruntime's is forked) that calls a module-level function on pickled arguments. A
child that fails for any reason gives None, and the caller does the work itself as before.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from npu.config import NpuConfig

#: programs shorter than this (instructions x samples) are checked in this process: a child's start
#: (about 0.6 s of imports and the container passed to it) would cost about what the runs take
MIN_INSTRUCTIONS = 40_000
#: float models with fewer weight bytes are quantised in this process (the quantiser's own time
#: grows with the weights; a child's start with onnxruntime's quantiser is about 1 s)
MIN_WEIGHT_BYTES = 16 << 20


def weight_bytes(model) -> int:
    """The bytes of a model's initialisers (what its quantisation's time grows with)."""
    inits = model.graph.initializer
    return sum(len(t.raw_data) or 4 * (len(t.float_data) + len(t.int32_data)) for t in inits)


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def worth(work: int, least: int) -> bool:
    """Whether a second process pays for `work` (instructions run, weight bytes) of at least `least`."""
    return cores() >= 2 and work >= least


class Child:
    """`func(*args)` computed in a child Python (`func` a module-level function)."""

    def __init__(self, func: Callable, *args: Any):
        self._dir = tempfile.TemporaryDirectory(prefix="npu-compile-")
        try:
            job = Path(self._dir.name) / "job.pickle"
            job.write_bytes(pickle.dumps((func, args), protocol=pickle.HIGHEST_PROTOCOL))
            self._out = Path(self._dir.name) / "result.pickle"
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "npu.compiler.parallel", str(job), str(self._out)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        except BaseException:  # arguments that do not pickle (an open NpzFile), a full disk, no Python
            self._dir.cleanup()
            raise

    def result(self) -> Any | None:
        """The function's value, or None when the child failed (the caller does the work)."""
        try:
            self._proc.wait()
            if self._proc.returncode != 0 or not self._out.exists():
                return None
            return pickle.loads(self._out.read_bytes())
        finally:
            self.close()

    def close(self) -> None:
        """Stop the child (if still running) and remove its files."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._dir.cleanup()


def start(func: Callable, *args: Any) -> Child | None:
    """`func(*args)` started in a child, or None when no child can start (the caller does it)."""
    try:
        return Child(func, *args)
    except Exception:  # noqa: BLE001 - any reason the child cannot start: the caller does the work
        return None


def golden_runs(
    raw: bytes, cfg: NpuConfig, inputs: list[list[np.ndarray]], times_at: str | None = None
) -> list[list[np.ndarray]]:
    """A container's (`raw`, its bytes) golden-model outputs on each input list, values only. First,
    with `times_at`, the golden model's timing of each NPU segment, written there as soon as it is
    known (`segment_times`; the compiler's timed assembly takes them while these runs go on)."""
    from npu.container import Container
    from npu.sim.golden.runner import run_container

    container = Container.from_bytes(raw)
    if times_at is not None:
        part = Path(times_at + ".part")
        part.write_bytes(pickle.dumps(segment_times(container, cfg), protocol=pickle.HIGHEST_PROTOCOL))
        part.rename(times_at)  # whole or not at all
    outputs = []
    for x in inputs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a host log of a value quantised to 0
            outputs.append(run_container(container, list(x), cfg, in_order=True)[0])
    return outputs


def segment_times(container, cfg: NpuConfig) -> list[tuple[dict[int, int], int]]:
    """Per NPU segment of a container (in order): the latest end of each pc's unit work and the
    segment's cycles, from the golden model's timing of its program run alone
    (`assemble._unit_ends`)."""
    from npu.container import NpuSegment
    from npu.isa import decode_program
    from npu.sim.golden.runner import timing_run

    from .assemble import _unit_ends

    program = decode_program(container.blobs["program"])
    out = []
    for s in container.manifest.segments:
        if isinstance(s, NpuSegment):
            m = timing_run(cfg, program[s.pc : s.end + 1], trace=True)
            out.append((_unit_ends(m), m.counter_values()["CYCLES"]))
    return out


class SegmentTimes:
    """Where a child's `golden_runs` writes `segment_times` (`path`), and `get(k)`: segment k's,
    waiting for the file while the child (`child`, once started) runs; None if it never comes (the
    caller times the segment itself)."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="npu-times-")
        self.path = str(Path(self._dir.name) / "times.pickle")
        self.child: Child | None = None
        self._times: list | None = None

    def get(self, k: int) -> tuple[dict[int, int], int] | None:
        if self._times is None and self.child is not None:
            path = Path(self.path)
            while not path.exists() and self.child._proc.poll() is None:
                time.sleep(0.01)
            try:
                self._times = pickle.loads(path.read_bytes())
            except (OSError, pickle.UnpicklingError, EOFError):  # the child failed before it
                self.child = None
        return self._times[k] if self._times is not None and k < len(self._times) else None

    def close(self) -> None:
        self._dir.cleanup()


def _main(job: str, out: str) -> None:
    func, args = pickle.loads(Path(job).read_bytes())
    Path(out).write_bytes(pickle.dumps(func(*args), protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    _main(*sys.argv[1:3])
