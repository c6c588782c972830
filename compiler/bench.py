"""`npu bench order`: what the order search buys on the zoo's branchy models, measured on the golden
model, and how long the search takes with and without the key-node partition."""

from __future__ import annotations

import sys

import numpy as np

from npu.arith import round_up
from npu.config import NpuConfig

from .assemble import assemble
from .cleanup import cleanup
from .compile import CompiledModel
from .graph import CompileError
from .lower import lower
from .order import search_order
from .quantize import quantize_float_model

BRANCHY = ("resnet_small", "inception_small", "perception")


def _zoo_model(name: str):
    from npu.models import zoo

    models = {**zoo.ZOO, **zoo.IMAGENET}
    if name not in models:
        raise CompileError(f"unknown zoo model {name!r}; choose from {', '.join(models)}")
    return models[name]()


def _measured_cycles(cm: CompiledModel, x: np.ndarray) -> int:
    from npu.sim.golden.runner import run_container

    _, counters = run_container(cm.to_container(), [x], cm.cfg)
    return counters["CYCLES"]


def bench_order(cfg: NpuConfig, names: list[str] | None = None, timeout_s: float = 60.0) -> dict:
    rows = []
    for name in names or BRANCHY:
        print(f"bench order: {name}", file=sys.stderr, flush=True)
        z = _zoo_model(name)
        qdq = quantize_float_model(cleanup(z.model), z.calib, name)
        low = lower(qdq, cfg, name)
        part = search_order(low, budget_s=None)
        full = search_order(low, partition=False, exhaustive_limit=None, budget_s=timeout_s)
        batch = z.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value
        x = z.test[:batch]
        measured = {}
        for label, order in (("default", None), ("searched", part.order)):
            lo = assemble(low, order)
            cm = CompiledModel(cfg, lo, round_up(lo.dram_end, 4096), qdq, name)
            measured[label] = _measured_cycles(cm, x)
        rows.append(
            {
                "model": name,
                "operators": len(low.frags),
                "subgraphs": len(part.subgraphs),
                "default_cycles": measured["default"],
                "searched_cycles": measured["searched"],
                "gain": 1 - measured["searched"] / measured["default"],
                "search_s": round(part.search_s, 3),
                "search_s_unpartitioned": "timeout" if full.timed_out else round(full.search_s, 3),
                "unpartitioned_timeout_s": timeout_s,
                "evaluations": sum(s.evaluated for s in part.subgraphs),
            }
        )
    return {"config": cfg.name, "models": rows}


BANK_MODELS = ("perception", "resnet_small", "inception_small", "digits_cnn", "squeezenet_like")


def bench_banks(cfg: NpuConfig, names: list[str] | None = None) -> dict:
    """`npu bench banks`: matrix cycles a banked scratchpad would need under each candidate bank
    mapping (npu.sim.golden.banks), for compiled zoo models and the GEMM benchmark's program."""
    import tempfile
    from pathlib import Path

    import onnx

    from npu.compiler.programs import gemm_program
    from npu.isa import decode_program
    from npu.sim.golden.banks import program_conflicts

    from .compile import compile_onnx

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or BANK_MODELS:
            print(f"bench banks: {name}", file=sys.stderr, flush=True)
            z = _zoo_model(name)
            path = Path(tmp) / f"{name}.onnx"
            onnx.save(z.model, str(path))
            c = compile_onnx(path, cfg, calib=z.calib, activations="int8").to_container()
            rows.append({"program": name, **program_conflicts(decode_program(c.blobs["program"]), cfg)})
    g = gemm_program(cfg, 256, 256, 256, 0x10000, 0x20000, 0x30000)
    rows.append({"program": "gemm 256^3", **program_conflicts(g.instrs, cfg)})
    return {"config": cfg.name, "programs": rows}


def format_banks(result: dict) -> str:
    """`bench_banks`'s figures as text."""
    lines = []
    for r in result["programs"]:
        maps = ", ".join(f"{k} ({v['banks']} banks) x{v['slowdown']:.2f}" for k, v in r["mappings"].items())
        lines.append(f"{r['program']}: {r['steps']:,} matrix steps in {r['matmuls']} MATMULs; {maps}")
    return "\n".join(lines)


def format_order(result: dict) -> str:
    """`bench_order`'s figures as text."""
    return "\n".join(
        f"{r['model']}: {r['default_cycles']:,} cycles in ONNX order, {r['searched_cycles']:,} "
        f"searched ({r['gain']:.1%} fewer); search {r['search_s']} s over {r['subgraphs']} "
        f"subgraphs, unpartitioned {r['search_s_unpartitioned']}"
        for r in result["models"]
    )


COMPILE_MODELS = ("perception", "resnet_small", "inception_small", *("resnet50_like", "inception_v1_like"))


def bench_compile(cfg: NpuConfig, names: list[str] | None = None, **options) -> dict:
    """`npu bench compile`: wall time of `compile_onnx` with the default options (but `options`) per
    model: zoo names, or ONNX files with their calibration beside them as `<stem>.calib.npy` (the
    zoo's layout). Time it on a quiet machine: a busy second core changes it 2-5x."""
    import tempfile
    import time
    from pathlib import Path

    import onnx

    from .compile import compile_onnx

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or COMPILE_MODELS:
            print(f"bench compile: {name}", file=sys.stderr, flush=True)
            if name.endswith(".onnx"):
                path = Path(name)
                calib_path = path.with_name(path.stem + ".calib.npy")
                if not path.is_file():
                    raise CompileError(f"{path}: no such ONNX file")
                if not calib_path.is_file():
                    raise CompileError(f"{path}: its calibration {calib_path} is missing")
                calib = np.load(calib_path)
            else:
                z = _zoo_model(name)
                path, calib = Path(tmp) / f"{name}.onnx", z.calib
                onnx.save(z.model, str(path))
            t0 = time.perf_counter()
            cm = compile_onnx(path, cfg, calib=calib, **options)
            seconds = time.perf_counter() - t0
            rows.append(
                {
                    "model": Path(name).stem if name.endswith(".onnx") else name,
                    "nodes": len(onnx.load(str(path)).graph.node),
                    "layers": len(cm.lowered.layers),
                    "quantisation": cm.quantisation,
                    "compile_s": round(seconds, 2),
                }
            )
    return {"config": cfg.name, "options": options, "models": rows}


def format_compile(result: dict) -> str:
    """`bench_compile`'s figures as text."""
    return "\n".join(
        f"{r['model']}: {r['nodes']} ONNX nodes -> {r['layers']} layers ({r['quantisation']}) "
        f"in {r['compile_s']} s"
        for r in result["models"]
    )
