"""Reference runtimes (operator queues): run a compiled model alone on a quiet engine and record each NPU
segment's measured cycles in the container (`NpuSegment.ref_cycles`, and `Layer.ref_cycles` where a
segment holds one operator, as with `--granularity operator`).

The seed's "first run in a preset environment": one application, one model, nothing else on the
device. The driver's operator queues then use these figures instead of the cost model's estimates.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from npu.container import Container, NpuSegment
from npu.executor import check_inputs

from .transport import Transport


def measure(
    transport: Transport, container: Container, inputs: list[np.ndarray] | None = None
) -> dict[int, int]:
    """Cycles of each NPU segment (by index) of one uninterrupted run on `transport`."""
    from .runtime import Npu

    npu = Npu(transport=transport, config=container.manifest.config, preempt=False)
    man = container.manifest
    if inputs is None:  # runtimes do not depend on the data: zeros are as good as any input
        inputs = [np.zeros(t.shape, np.float32) for t in man.inputs]
    check_inputs(man, inputs)
    job = npu.load(container, "profiled").submit(*inputs)
    job.result()
    return dict(job.segment_cycles)


def with_reference_runtimes(container: Container, cycles: dict[int, int]) -> Container:
    """A copy of `container` whose segments (and single-operator layers) carry `cycles`."""
    man = container.manifest
    segs = list(man.segments)
    for i, c in cycles.items():
        if not isinstance(segs[i], NpuSegment):
            raise ValueError(f"segment {i} is a host step: it has no NPU runtime")
        segs[i] = dataclasses.replace(segs[i], ref_cycles=int(c))
    layers = list(man.layers)
    for s in segs:
        if not isinstance(s, NpuSegment) or s.ref_cycles is None:
            continue
        inside = [k for k, la in enumerate(layers) if la.pc and s.pc <= la.pc[0] < s.end]
        if len(inside) == 1:
            layers[inside[0]] = dataclasses.replace(layers[inside[0]], ref_cycles=s.ref_cycles)
    new = dataclasses.replace(man, segments=segs, layers=layers)
    return Container(container.config_id, new, dict(container.blobs))
