"""`npu compile`: an ONNX model to an .npub container."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ..config import PRESETS
from .common import CliError, input_file, int_in, number, output_file, positive_float

HELP = "compile an ONNX model to an .npub container"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX model (float with --calib, or QDQ int8)")
    p.add_argument("-o", "--output", help="output .npub (default: MODEL with .npub)")
    p.add_argument("--config", default="default", help=f"hardware preset: {', '.join(PRESETS)}")
    p.add_argument(
        "--calib",
        metavar="CALIB.npy",
        help="calibration inputs for a float model: an .npy of samples stacked on the first axis, or "
        "for a model of several inputs an .npz with one such array per input name",
    )
    p.add_argument(
        "--input-shape",
        action="append",
        type=input_shape,
        default=[],
        metavar="NAME=1x3x224x224",
        help="static shape of a graph input with dynamic dimensions (repeat for several inputs)",
    )
    p.add_argument(
        "--report",
        action="store_true",
        help="print placement, splits, subgraphs and chosen orders, cancellation points, cycles, "
        "scratchpad peak, DRAM plan (arena peak, lower bound, one range per tensor)",
    )
    p.add_argument(
        "--order",
        choices=["search", "default"],
        default="search",
        help="operator order: search (key-node partitioned, golden-model timing) or default (ONNX order)",
    )
    p.add_argument(
        "--order-objective",
        choices=["cycles", "memory"],
        default="cycles",
        help="what the order search minimises: cycles (golden-model timing, default) or memory (the "
        "most activation bytes live at once, the DRAM arena's lower bound; ties by cycles)",
    )
    p.add_argument(
        "--weight-scales",
        choices=["auto", "per-channel", "per-tensor"],
        default="auto",
        help="how a float model's weights are quantised: one scale per output channel (accurate; "
        "requantised through a per-column table, a few %% more cycles), one per tensor, or auto "
        "(default: per channel when one scale would leave some channel 1/8 of the int8 range or less)",
    )
    p.add_argument(
        "--calib-method",
        choices=["minmax", "percentile", "entropy"],
        default="minmax",
        help="how a float model's activation ranges come from the calibration inputs (onnxruntime's "
        "calibrators): the extremes seen (default), the 99.999th percentile, or entropy",
    )
    p.add_argument(
        "--activations",
        choices=["auto", "int8", "int16"],
        default="auto",
        help="a float model's activation type: int16 (symmetric, twice the calibrated range, int8 "
        "weights: keeps the accuracy int8 activations lose on real models), int8 (asymmetric: "
        "about half the cycles, as int16 MATMULs and vector passes take twice as long), or auto "
        "(default: int16, or int8 when the int16 model does not fit the configuration)",
    )
    p.add_argument(
        "--weight-rounding",
        choices=["auto", "nearest", "gptq"],
        default="auto",
        help="which int8 value each of a float model's weights takes: nearest; gptq: per layer, "
        "the rounding that lowers its output error on the calibration inputs (GPTQ; a layer keeps "
        "the nearest where that is better); auto (default): gptq's if the whole model's outputs on "
        "the calibration inputs come out closer to the float model's, else nearest",
    )
    p.add_argument(
        "--output-precision",
        choices=["int32", "int8"],
        default="int32",
        help="a float model's outputs: int32 (default: a Gemm/MatMul read only as a graph output or "
        "by host operators such as Softmax stores its int32 accumulators, dequantised on the host "
        "with one scale per column, so logits are neither clipped nor rounded to the calibrated "
        "int8 scale) or int8 (the calibrated output scale)",
    )
    p.add_argument(
        "--order-budget",
        type=positive_float,
        default=10.0,
        metavar="S",
        help="time limit of the order search (s)",
    )
    p.add_argument(
        "--cp-interval",
        type=int_in(0),
        default=0,
        metavar="N",
        help="also place cancellation points inside operators, at most N estimated cycles apart where "
        "possible (default 0: only at operator boundaries)",
    )
    p.add_argument(
        "--cp-max-live",
        type=int_in(0),
        metavar="BYTES",
        help="skip interior points whose live on-chip data exceed BYTES (default: a quarter of the "
        "scratchpad)",
    )
    p.add_argument(
        "--granularity",
        choices=["segment", "operator", "step"],
        default="segment",
        help="segment: NPU operators back to back (default); operator: every operator its own unit "
        "of work (DRAM in, DRAM out) with the operator graph, for scheduling across engines; step: "
        "as operator, with operators also cut into chained segments of about --step-cycles, for "
        "the layer-wise scheduler of several models on one engine",
    )
    p.add_argument(
        "--step-cycles",
        type=int_in(1),
        default=20_000,
        metavar="CYCLES",
        help="--granularity step: cost-model cycles per segment of a cut operator (default 20000)",
    )
    for mem, what in (("spad", "scratchpad"), ("acc", "accumulator memory")):
        p.add_argument(
            f"--{mem}-region",
            type=region,
            metavar="START:SIZE",
            help=f"use only these bytes of the {what} (e.g. 0:128K; numbers decimal or 0x, K = 1024"
            + (
                "), so models resident at once never touch each other's on-chip data"
                if mem == "spad"
                else ", offsets into it; default: the scratchpad region's share of it)"
            ),
        )


def region(text: str) -> tuple[int, int]:
    """An argparse type: START:SIZE, each decimal or 0x hex with an optional K (x 1024) suffix."""
    start, colon, size = text.partition(":")

    def num(t: str) -> int:
        t = t.strip()
        k = t[-1:] in ("k", "K")
        return number(t[:-1] if k else t) * (1024 if k else 1)

    try:
        if not colon:
            raise argparse.ArgumentTypeError("")
        return num(start), num(size)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not START:SIZE in bytes (decimal or 0x, K = 1024), e.g. 0:128K"
        ) from None


def input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """An argparse type: NAME=D1xD2x... with positive dimensions."""
    name, eq, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        shape = ()
    if not eq or not name or not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=D1xD2x... with dimensions >= 1, e.g. input=1x3x224x224"
        )
    return name, shape


def run(args: argparse.Namespace) -> int:
    from npu.compiler import CompileError, compile_onnx

    out = output_file(args.output or Path(args.model).with_suffix(".npub"))
    calib = None
    if args.calib:
        input_file(args.calib)
        try:
            calib = np.load(args.calib)
            if isinstance(calib, np.lib.npyio.NpzFile):  # one array per graph input, by name
                calib = {name: calib[name] for name in calib.files}
        except (OSError, ValueError) as e:
            raise CliError(f"--calib {args.calib}: cannot read: {e}") from None
    shapes = dict(args.input_shape)
    if len(shapes) < len(args.input_shape):
        names = [n for n, _ in args.input_shape]
        raise CliError(f"--input-shape {next(n for n in names if names.count(n) > 1)} is given twice")
    try:
        cm = compile_onnx(
            args.model,
            args.config,
            calib=calib,
            order=args.order,
            order_budget_s=args.order_budget,
            order_objective=args.order_objective,
            weight_scales=args.weight_scales,
            calib_method=args.calib_method,
            activations=args.activations,
            output_precision=args.output_precision,
            weight_rounding=args.weight_rounding,
            cp_interval=args.cp_interval,
            cp_max_live=args.cp_max_live,
            granularity=args.granularity,
            step_cycles=args.step_cycles,
            input_shapes=shapes,
            spad_region=args.spad_region,
            acc_region=args.acc_region,
        )
    except CompileError as e:
        raise CliError(str(e)) from None
    cm.to_container().save(out)
    low = cm.lowered
    n_npu = sum(la.placement == "npu" for la in low.layers)
    n_host = sum(la.placement == "host" for la in low.layers)
    print(
        f"{args.model} -> {out}: {len(low.program)} instructions, {n_npu} NPU operators, "
        f"{n_host} host operators, {len(low.cancel_points)} cancellation points, config {cm.cfg.name}"
        + (f", {cm.regions.describe()}" if cm.regions else "")
    )
    if args.report:
        print(cm.report())
    return 0
