"""Small driver jobs the CLI runs on the RTL (functions `run_on_rtl` can import by name)."""

from __future__ import annotations

import numpy as np


def run_model(transport, container, inputs: list[np.ndarray]) -> tuple[list[np.ndarray], dict[str, int]]:
    """Load a compiled model, run it once; its float outputs and the job's performance counters."""
    from npu.driver import Npu

    npu = Npu(transport=transport, config=container.manifest.config)
    job = npu.load(container).submit(*inputs)
    return job.result(), job.counters
