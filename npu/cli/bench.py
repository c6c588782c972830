"""`npu bench WHAT`: benchmarks that print machine-readable figures (`--json`) or a summary. Each
bench and its text formatting live beside what they measure."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from ..config import PRESETS, NpuConfig, get_config
from .common import CliError, int_in, positive_float

HELP = "benchmarks that print figures (use --json)"
Bench = Callable[[NpuConfig, argparse.Namespace], tuple[dict, Callable[[dict], str]]]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "what",
        choices=list(BENCHES),
        help="model: GEMM on the golden model; gemm: GEMM sweep on --backend; compile: compile time of "
        "zoo models (--models: zoo names or ONNX files with <stem>.calib.npy beside them); "
        "models: the real-model set and the zoo compiled with the default options - MACs, golden and "
        "predicted cycles, int8-peak utilisation, int8 MAC share, cosine, compile time, largest "
        "cancellation-point gap (--models: names; --inputs: held-out inputs a model); "
        "order: operator order search on the zoo's branchy models; preempt: the preemption "
        "scenario and strategies; banks: matrix slowdown of candidate scratchpad bank mappings; "
        "soc: the SoC model against the RTL with 2 and 4 engines of --config contending for DRAM; "
        "opqueue: operator-queue policies over 2 and 4 engines at 50/80/95 %% load "
        "(--backend rtl adds 2 engines on the RTL against the model); pipeline: loader scaling, stage "
        "overlap and speedup of the pipeline machinery; layerwise: pairs of a compute- and a "
        "memory-intensive model on one engine through the command ring, per policy (layer-wise scheduling; "
        "--backend rtl adds two pairs on the RTL core); service: host time and memory per job over many "
        "jobs of one model (a long-running device stays flat); board: per-inference cycles of the tinyML "
        "models on a board's simulated top (--board; the bitstream's RTL, its DRAM model, the UART), the "
        "golden model's beside them, latency at the last build's Fmax, probe programs of single "
        "instructions; roofline: per model (default: the tinyML set) the compute and DRAM floors of an "
        "inference on --config and the MAC utilisation each allows, beside the golden model's",
    )
    p.add_argument(
        "--models",
        nargs="+",
        help="order, banks, compile, models, roofline, board: models (default: a representative set)",
    )
    p.add_argument(
        "--activations",
        choices=["auto", "int8", "int16"],
        help="compile: the compiler's activation precision (default: the compiler's default)",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=60.0,
        help="order: time limit of the unpartitioned search (s)",
    )
    p.add_argument("--backend", choices=["model", "rtl"], default="model", help="where to measure")
    p.add_argument(
        "--config",
        help=f"hardware preset: {', '.join(PRESETS)} (default: default; layerwise: multi, whose deep "
        "unit queues let one model's loads run under another's compute; board: the board's own)",
    )
    p.add_argument("--size", type=int_in(1, 4096), default=256, help="model GEMM m = n = k (default 256)")
    p.add_argument("--sizes", type=int_in(1, 4096), nargs="+", help="RTL GEMM sizes (default 64 128 256)")
    p.add_argument(
        "--cp-every",
        type=int_in(1),
        default=1,
        help="RTL pause-latency program: a cancellation point every this many output tiles",
    )
    p.add_argument(
        "--axi-ram",
        action="store_true",
        help="RTL: serve DRAM with cocotbext-axi's AxiRam (slower) instead of the in-simulator RAM",
    )
    p.add_argument("--frames", type=int_in(1, 1000), default=4, help="preempt: frames of the scenario")
    p.add_argument(
        "--cp-interval", type=int_in(1), default=20_000, help="preempt: the compiler's point interval"
    )
    p.add_argument(
        "--jobs",
        type=int_in(1, 1_000_000),
        help="opqueue: jobs per application (default 100); service: jobs in all (default 20000)",
    )
    p.add_argument(
        "--inputs", type=int_in(1, 1000), help="models: held-out inputs a model (default: all of them)"
    )
    p.add_argument(
        "--rtl-jobs", type=int_in(1, 100), default=3, help="opqueue: jobs per application on the RTL"
    )
    p.add_argument("--seed", type=int_in(0), default=1, help="opqueue: seed of the Poisson arrivals")
    p.add_argument(
        "--instances",
        type=int_in(1, 8),
        default=1,
        help="opqueue: copies of each model per engine (how many of an application's jobs per engine "
        "may be in flight; later arrivals wait for a copy)",
    )
    p.add_argument(
        "--seeds",
        type=int_in(1, 100),
        default=1,
        help="opqueue: run the model part for this many seeds from --seed on (p99_cut_mean: the cuts' mean)",
    )
    p.add_argument(
        "--board", default="ulx3s", help="board: the board (ulx3s, icebreaker; default ulx3s)"
    )
    p.add_argument(
        "--no-probes", action="store_true", help="board: skip the probe programs (models only)"
    )
    p.add_argument("--plot", metavar="PNG", help="board: also draw the latency per model into this PNG")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _rtl_runner(args: argparse.Namespace):
    """The harness's `run_on_rtl` for `--backend rtl`, else None (the driver's benches take it)."""
    if args.backend != "rtl":
        return None
    from npu.sim.rtl.transport import run_on_rtl

    return run_on_rtl


def _model(cfg: NpuConfig, args: argparse.Namespace):
    from npu.sim.rtl.gemm_bench import bench_model, format_model

    return bench_model(cfg, args.size), format_model


def _gemm(cfg: NpuConfig, args: argparse.Namespace):
    if args.backend == "model":
        return _model(cfg, args)
    from npu.sim.rtl.gemm_bench import bench_rtl, format_rtl

    sizes = args.sizes or [64, 128, 256]
    return bench_rtl(cfg, sizes, fast_dram=not args.axi_ram, pause_interval_tiles=args.cp_every), format_rtl


def _preempt(cfg: NpuConfig, args: argparse.Namespace):
    from npu.driver.bench import bench_preempt, format_preempt, rtl_bench_preempt
    from npu.driver.demo import build_models, strategy_models

    models = build_models(cfg.name, args.cp_interval, cache=Path("build") / "demo")
    strategies = strategy_models(cfg.name, args.cp_interval, cache=Path("build") / "demo")
    if args.backend == "rtl":
        from npu.sim.rtl.transport import run_on_rtl

        result = run_on_rtl(rtl_bench_preempt, cfg.name, models, strategies, args.frames, config=cfg)
    else:
        from npu.driver import ModelTransport

        result = bench_preempt(lambda: ModelTransport(cfg), cfg, models, strategies, args.frames)
    result["backend"] = args.backend
    result["cp_interval"] = args.cp_interval
    return result, format_preempt


def _soc(cfg: NpuConfig, args: argparse.Namespace):
    from npu.sim.rtl.soc_bench import bench_soc, format_soc

    if args.backend != "rtl":
        raise CliError("bench soc compares the SoC's RTL with its model: use --backend rtl")
    return bench_soc(cfg), format_soc


def _opqueue(cfg: NpuConfig, args: argparse.Namespace):
    import sys

    from npu.driver.sched.bench import bench_opqueue, format_opqueue

    result = bench_opqueue(
        cfg.engine.name,
        jobs=args.jobs or 100,
        seed=args.seed,
        seeds=args.seeds,
        rtl=_rtl_runner(args),
        rtl_jobs=args.rtl_jobs,
        instances=args.instances,
        progress=lambda msg: print(f"bench opqueue: {msg}", file=sys.stderr, flush=True),
    )
    return result, format_opqueue


def _pipeline(cfg: NpuConfig, args: argparse.Namespace):
    import sys

    from npu.driver.pipeline.bench import bench_pipeline, format_pipeline

    res = bench_pipeline(progress=lambda msg: print(f"bench pipeline: {msg}", file=sys.stderr, flush=True))
    return res, format_pipeline


def _layerwise(cfg: NpuConfig, args: argparse.Namespace):
    import sys

    from npu.driver.sched.layerwise_bench import bench_layerwise, format_layerwise

    res = bench_layerwise(
        cfg.engine.name,
        progress=lambda msg: print(f"bench layerwise: {msg}", file=sys.stderr, flush=True),
        rtl=_rtl_runner(args),
    )
    return res, format_layerwise


def _banks(cfg: NpuConfig, args: argparse.Namespace):
    from npu.compiler.bench import bench_banks, format_banks

    return bench_banks(cfg, args.models), format_banks


def _order(cfg: NpuConfig, args: argparse.Namespace):
    if args.backend != "model":
        raise CliError("bench order measures on the golden model; --backend rtl is not supported")
    from npu.compiler.bench import bench_order, format_order

    return bench_order(cfg, args.models, args.timeout), format_order


def _compile(cfg: NpuConfig, args: argparse.Namespace):
    if args.backend != "model":
        raise CliError("bench compile measures the compiler; --backend rtl is not supported")
    from npu.compiler.bench import bench_compile, format_compile

    options = {"activations": args.activations} if args.activations else {}
    return bench_compile(cfg, args.models, **options), format_compile


def _models(cfg: NpuConfig, args: argparse.Namespace):
    if args.backend != "model":
        raise CliError("bench models measures on the golden model; --backend rtl is not supported")
    from npu.compiler.bench import bench_models, format_models

    return bench_models(cfg, args.models, args.inputs), format_models


def _roofline(cfg: NpuConfig, args: argparse.Namespace):
    if args.backend != "model":
        raise CliError("bench roofline measures on the golden model; --backend rtl is not supported")
    from npu.compiler.roofline import bench_roofline, format_roofline

    return bench_roofline(cfg, args.models), format_roofline


def _board(cfg: NpuConfig, args: argparse.Namespace):
    if args.backend != "model":
        raise CliError("bench board runs on the board's simulated top: --backend does not apply")
    from npu.sim.rtl.board_bench import bench_board, format_board, save_plot

    # --config: another preset on the same board (its DRAM, clock and pins), e.g. a larger array
    result = bench_board(args.board, args.models, probes=not args.no_probes, config=args.config)
    if args.plot:
        save_plot([result], args.plot)
    return result, format_board


def _service(cfg: NpuConfig, args: argparse.Namespace):
    import sys

    from npu.driver.service_bench import bench_service, format_service

    if args.backend != "model":
        raise CliError(
            "bench service measures the driver on the golden model; --backend rtl is not supported"
        )
    res = bench_service(
        args.config or "tiny",
        args.jobs or 20_000,
        progress=lambda msg: print(f"bench service: {msg}", file=sys.stderr, flush=True),
    )
    return res, format_service


BENCHES: dict[str, Bench] = {
    "compile": _compile,
    "models": _models,
    "model": _model,
    "gemm": _gemm,
    "order": _order,
    "preempt": _preempt,
    "banks": _banks,
    "soc": _soc,
    "opqueue": _opqueue,
    "pipeline": _pipeline,
    "layerwise": _layerwise,
    "service": _service,
    "board": _board,
    "roofline": _roofline,
}


def run(args: argparse.Namespace) -> int:
    from npu.compiler import CompileError

    cfg = get_config(args.config or ("multi" if args.what == "layerwise" else "default"))
    try:
        result, text = BENCHES[args.what](cfg, args)
    except CompileError as e:  # an unknown or uncompilable zoo model
        raise CliError(str(e)) from None
    print(json.dumps(result) if args.json else text(result))
    return 0
