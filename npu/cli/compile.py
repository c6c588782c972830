"""`npu compile`: an ONNX model to an .npub container."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ..config import PRESETS
from .common import CliError, input_file, int_in, output_file, positive_float

HELP = "compile an ONNX model to an .npub container"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX model (float with --calib, or QDQ int8)")
    p.add_argument("-o", "--output", help="output .npub (default: MODEL with .npub)")
    p.add_argument("--config", default="default", help=f"hardware preset: {', '.join(PRESETS)}")
    p.add_argument("--calib", metavar="CALIB.npy", help="calibration inputs for a float model")
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
        "scratchpad peak",
    )
    p.add_argument(
        "--order",
        choices=["search", "default"],
        default="search",
        help="operator order: search (key-node partitioned, golden-model timing) or default (ONNX order)",
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
        choices=["segment", "operator"],
        default="segment",
        help="segment: NPU operators back to back (default); operator: every operator its own unit "
        "of work (DRAM in, DRAM out) with the operator graph, for scheduling across engines",
    )


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
            cp_interval=args.cp_interval,
            cp_max_live=args.cp_max_live,
            granularity=args.granularity,
            input_shapes=shapes,
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
    )
    if args.report:
        print(cm.report())
    return 0
