"""`npu bench order`: what the order search buys on the zoo's branchy models, measured on the golden
model, and how long the search takes with and without the key-node partition."""

from __future__ import annotations

import sys
from functools import partial

import numpy as np

from npu.arith import round_up
from npu.config import NpuConfig

from .assemble import assemble
from .cleanup import cleanup
from .compile import CompiledModel
from .graph import CompileError
from .lower import lower
from .order import search_order, whole_program
from .quantize import quantize_float_model

BRANCHY = ("resnet_small", "inception_small", "perception")


def zoo_builders(names: list[str]) -> dict:
    """The zoo's builders of `names` (its small models, the ImageNet-sized and the tinyML ones), every
    name checked before any model is built."""
    from npu.models import zoo

    models = {**zoo.ZOO, **zoo.IMAGENET, **zoo.TINYML}
    for name in names:
        if name not in models:
            raise CompileError(f"unknown zoo model {name!r}; choose from {', '.join(models)}")
    return {name: models[name] for name in names}


def _zoo_model(name: str):
    return zoo_builders([name])[name]()


def _run(cm: CompiledModel, x: np.ndarray) -> tuple[list[np.ndarray], dict[str, int]]:
    """(outputs, counters) of one run of `cm` on the golden model."""
    from npu.sim.golden.runner import run_container

    return run_container(cm.to_container(), [x], cm.cfg)


def _measured_cycles(cm: CompiledModel, x: np.ndarray) -> int:
    return _run(cm, x)[1]["CYCLES"]


def _assembled(low, default, order: list[int] | None):
    """`low` assembled in `order`, the ONNX order's build (None) given."""
    return default if order is None else assemble(low, order)


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
        default = assemble(low, None)  # whole_program's ONNX-order build too
        searched = whole_program(part, len(low.frags), partial(_assembled, low, default))
        for label, lo in (("default", default), ("searched", searched)):
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


def bench_models(cfg: NpuConfig, names: list[str] | None = None, max_inputs: int | None = None) -> dict:
    """`npu bench models`: per model of the real-model set (`npu.models.real`, downloaded once) and
    the zoo's small models, compiled with the default options: MACs, golden-model and predicted
    cycles, utilisation of the int8 MAC peak (NPU MACs / (golden cycles x MACs a cycle)), the int8
    share of the NPU's MACs, the least cosine against onnxruntime float over the held-out inputs
    (the first `max_inputs`), compile seconds, the largest cancellation-point gap and the
    accuracy guard's verdict (a refused model is measured compiled with the check off)."""
    import tempfile
    import time
    from pathlib import Path

    import onnx

    from npu.models import zoo

    from .accuracy import cosine
    from .compile import compile_onnx
    from .errors import AccuracyError
    from .load import load
    from .quantize import ort_session

    try:
        from npu.models.real.catalog import MODELS
        from npu.models.real.fetch import fetch
        from npu.models.real.inputs import calibration, held_out
    except ImportError as e:  # Pillow renders the calibration pages
        raise CompileError(f"bench models needs the dev extras (pip install -e '.[dev]'): {e}") from None
    real = {m.name: m for m in MODELS}
    zoo_names = list(zoo.ZOO)
    known = [*real, *zoo_names, *zoo.IMAGENET]
    for n in names or []:
        if n not in known:
            raise CompileError(f"unknown model {n!r}; choose from {', '.join(known)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or [*real, *zoo_names]:
            print(f"bench models: {name}", file=sys.stderr, flush=True)
            if name in real:
                m = real[name]
                path, calib, xs = fetch(m, say=lambda _s: None), calibration(m), held_out(m)
                shapes, kind = {m.input: m.shape}, "real"
            else:
                z = _zoo_model(name)
                path, calib, shapes, kind = Path(tmp) / f"{name}.onnx", z.calib, {}, "zoo"
                onnx.save(z.model, str(path))
                batch = z.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value or 1
                xs = np.stack([z.test[i : i + batch] for i in range(0, len(z.test) - batch + 1, batch)])
            t0 = time.perf_counter()
            verdict = "passed"
            try:
                cm = compile_onnx(path, cfg, calib=calib, input_shapes=shapes)
                if cm.accuracy is not None and cm.accuracy.moved:
                    verdict = "repaired"
                elif "int16 weights (" in cm.quantisation:  # the default takes them only as a repair
                    verdict = "repaired (int16 weights)"
            except AccuracyError as e:
                verdict = f"refused: {e}"
                cm = compile_onnx(path, cfg, calib=calib, input_shapes=shapes, accuracy_check=False)
            compile_s = time.perf_counter() - t0
            sess = ort_session(load(path, shapes or None).model)
            cos, cycles = 1.0, None
            for x in list(xs)[:max_inputs]:
                x = x if kind == "zoo" else x[None]
                got, counters = _run(cm, x)
                want = sess.run(None, {sess.get_inputs()[0].name: x})
                cos = min(cos, *(cosine(g, w) for g, w in zip(got, want, strict=True)))
                cycles = counters["CYCLES"] if cycles is None else cycles  # the first input's
            p = cm.placement
            rows.append(
                {
                    "name": name,
                    "set": kind,
                    "macs": p.macs_npu + p.macs_host,
                    "cycles": cycles,
                    "predicted_cycles": sum(
                        la.est_cycles or 0 for la in cm.lowered.layers if la.placement == "npu"
                    ),
                    "utilization": round(p.macs_npu / (cycles * cfg.macs_per_cycle), 4) if cycles else None,
                    "int8_mac_share": round(p.int8_mac_share, 4),
                    "cosine": round(cos, 5),
                    "compile_s": round(compile_s, 2),
                    "max_cp_gap": cm.max_cp_gap,
                    "cp_cycles_added": cm.cp_cycles_added,
                    "accuracy_check": verdict,
                    "quantisation": cm.quantisation,
                }
            )
    utils = [r["utilization"] for r in rows if r["set"] == "real" and r["utilization"]]
    gm = float(np.exp(np.mean(np.log(utils)))) if utils else None
    return {"config": cfg.name, "models": rows, "real_geomean_utilization": gm and round(gm, 4)}


def format_models(result: dict) -> str:
    """`bench_models`'s figures as text."""
    lines = [
        f"{r['name']} ({r['set']}): {r['macs']:,} MACs, {r['cycles']:,} cycles (predicted "
        f"{r['predicted_cycles']:,}), utilisation {r['utilization']}, int8 MAC share {r['int8_mac_share']}, "
        f"cosine {r['cosine']}, compile {r['compile_s']} s, largest point gap {r['max_cp_gap']:,}"
        + (f" (the points add {r['cp_cycles_added']:,} cycles)" if r.get("cp_cycles_added") else "")
        + ", "
        f"accuracy check {r['accuracy_check'].split(':')[0]}"
        for r in result["models"]
    ]
    gm = result["real_geomean_utilization"]
    return "\n".join(lines + ([f"real-model set: geometric-mean utilisation {gm}"] if gm else []))
