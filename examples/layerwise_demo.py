"""Two models interleaved layer by layer on one engine through the command ring (layer-wise scheduling).

A compute-bound CNN and a memory-bound MLP, each compiled one segment per layer into its own half of
the scratchpad, are submitted together; the same pair runs under `fcfs` (one model after the other)
and `idle-time` (the design's rule). Prints the makespans and the order the layers completed in, and
writes a Perfetto trace per policy (one track per unit, each instruction named by its model and
layer) to out/layerwise/.

    python examples/layerwise_demo.py [--cnn digits_cnn] [--mlp digits_mlp]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from npu.driver import Npu
from npu.driver.sched.layerwise import LayerwiseScheduler, chrome_trace
from npu.driver.sched.layerwise_bench import prepare


def run(models, policy: str, out: Path) -> LayerwiseScheduler:
    npu = Npu("model", "default", trace=None)
    npu.tr.model.trace = []  # the golden model's instruction trace
    s = LayerwiseScheduler(npu, policy)
    reqs = [s.submit(m.container, [m.x], name=m.name) for m in models]
    s.run()
    (out / f"{policy}.json").write_text(json.dumps(chrome_trace(s, npu.tr.model.trace, npu.cfg.clock_mhz)))
    s.reqs = reqs
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cnn", default="digits_cnn")
    ap.add_argument("--mlp", default="digits_mlp")
    ap.add_argument("-o", "--out", default="out/layerwise")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    models = [prepare(a.cnn, "default", 0), prepare(a.mlp, "default", 1)]
    runs = {p: run(models, p, out) for p in ("fcfs", "idle-time")}
    for p, s in runs.items():
        order = " ".join(f"{name}:{layer}" for _, name, layer, _ in s.timeline)
        print(f"{p:>9}: makespan {s.makespan} cycles; layers completed: {order}")
    for x, y in zip(runs["fcfs"].reqs, runs["idle-time"].reqs, strict=True):
        assert all(np.array_equal(u, v) for u, v in zip(x.outputs, y.outputs, strict=True))
    print(f"same outputs under both policies; traces in {out}/ (open in https://ui.perfetto.dev)")


if __name__ == "__main__":
    main()
