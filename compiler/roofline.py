"""`npu bench roofline`: how much of the MAC array a model could use on a configuration at best.

An inference cannot take fewer cycles than its MACs at the array's peak (the compute floor) or than
its DRAM traffic at the DRAM's rate (`npu.timing.dram_floor_cycles`, the memory floor). The traffic
is counted three ways, from the least any program could move to what this compile moves:

- `weights_io`: every constant image (weights, biases, tables) read once, the inputs read and the
  outputs written once: no program moves less, short of keeping weights on chip between inferences;
- `program`: that and this program's instructions, each fetched once (32 bytes an instruction);
- `run`: this program's own loads and stores (the golden model's DMA counters) and its instructions.

Each floor gives a utilisation bound, MACs / (peak x the larger floor): where the measured
utilisation sits under `run`'s bound the time is lost to overlap and stalls; where `run`'s bound
sits under `weights_io`'s it is lost to activations spilled through DRAM and to instruction fetch.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

from npu.config import NpuConfig
from npu.timing import dram_floor_cycles

from .compile import CompiledModel

#: the tinyML set, the models the "fill the FPGA" targets are set on
DEFAULT = ("ds_cnn_kws", "resnet8", "mobilenet_v1_025_vww", "fc_autoencoder")


def traffic(cm: CompiledModel, counters: dict[str, int] | None = None) -> dict[str, int]:
    """Bytes an inference of `cm` moves through DRAM: its constant images, its NPU inputs and
    outputs, its program; with `counters` (of a golden-model run) the loads' and stores' bytes."""
    low = cm.lowered
    def nbytes(tensors) -> int:  # host-only tensors never reach DRAM
        return sum(t.layout.nbytes for t in tensors if hasattr(t, "layout"))

    out = {
        "constants": sum(len(d) for _, d in low.dram),
        "inputs": nbytes(low.inputs),
        "outputs": nbytes(low.outputs),
        "program": len(cm.program),
    }
    if counters is not None:
        out["dma_read"], out["dma_write"] = int(counters["DMA_RD_BYTES"]), int(counters["DMA_WR_BYTES"])
    return out


def roofline(cfg: NpuConfig, macs: int, moved: dict[str, int], peak: float | None = None) -> dict:
    """The compute floor, the memory floors of `moved` (`traffic`) and the utilisation bound of each,
    at `peak` MACs a cycle (default: the array's)."""
    peak = peak or cfg.macs_per_cycle
    compute = math.ceil(macs / peak)
    data = moved["constants"] + moved["inputs"]
    reads = {"weights_io": data, "program": data + moved["program"]}
    floors = {k: dram_floor_cycles(cfg, r, moved["outputs"]) for k, r in reads.items()}
    if "dma_read" in moved:
        floors["run"] = dram_floor_cycles(cfg, moved["dma_read"] + moved["program"], moved["dma_write"])
    bounds = {k: round(macs / (peak * max(compute, f, 1)), 4) for k, f in floors.items()}
    return {"compute_cycles": compute, "memory_floor_cycles": floors, "utilization_bound": bounds}


def bench_roofline(cfg: NpuConfig, names: list[str] | None = None) -> dict:
    """Per zoo model (default: the tinyML set) compiled for `cfg` with the default options: MACs, the
    bytes it moves, the floors and bounds of `roofline`, and the golden model's cycles and utilisation."""
    import onnx

    from npu.sim.golden.runner import run_container

    from .bench import zoo_builders
    from .compile import compile_onnx

    rows = []
    with tempfile.TemporaryDirectory(prefix="roofline-") as tmp:
        for name, build in zoo_builders(list(names or DEFAULT)).items():
            print(f"bench roofline: {name} on {cfg.name}", file=sys.stderr, flush=True)
            z = build()
            path = Path(tmp) / f"{name}.onnx"
            onnx.save(z.model, str(path))
            cm = compile_onnx(path, cfg, calib=z.calib)
            batch = z.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value or 1
            _, counters = run_container(cm.to_container(), [z.test[:batch]], cfg)
            macs, cycles = cm.placement.macs_npu, int(counters["CYCLES"])
            moved = traffic(cm, counters)
            rows.append(
                {
                    "name": name,
                    "macs": macs,
                    "bytes": moved,
                    **roofline(cfg, macs, moved),
                    "cycles": cycles,
                    "utilization": round(macs / (cycles * cfg.macs_per_cycle), 4),
                    "instructions": int(counters["INSTRET"]),
                }
            )
    return {
        "config": cfg.name,
        "macs_per_cycle": cfg.macs_per_cycle,
        "dram_bytes_per_cycle": cfg.dram_word_bytes or cfg.bus_bytes,
        "models": rows,
    }


def format_roofline(r: dict) -> str:
    lines = [
        f"{r['config']}: {r['macs_per_cycle']} MACs/cycle, DRAM {r['dram_bytes_per_cycle']} bytes/cycle; "
        "utilisation measured (golden model) and its bounds: weights+io / +program / this run's traffic"
    ]
    for m in r["models"]:
        b, f = m["utilization_bound"], m["memory_floor_cycles"]
        lines.append(
            f"  {m['name']}: {m['cycles']:,} cycles, utilisation {m['utilization']:.3f}; bounds "
            f"{b['weights_io']:.3f} / {b['program']:.3f} / {b['run']:.3f} (compute {m['compute_cycles']:,} "
            f"cycles, memory {f['weights_io']:,} / {f['program']:,} / {f['run']:,})"
        )
    return "\n".join(lines)
