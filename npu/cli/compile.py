"""`npu compile`: an ONNX model to an .npub container."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from ..compiler import options
from ..config import PRESETS
from .common import CliError, input_file, output_file

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
        "--report",
        action="store_true",
        help="print placement, splits, subgraphs and chosen orders, cancellation points, cycles, "
        "scratchpad peak, DRAM plan (arena peak, lower bound, one range per tensor)",
    )
    options.add_arguments(p)  # one argument per CompileOptions field


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
    try:
        # stage by stage on a terminal (a compile of a large model takes minutes)
        say = (
            (lambda line: print(f"npu compile: {line}", file=sys.stderr, flush=True))
            if sys.stderr.isatty()
            else None
        )
        cm = compile_onnx(
            args.model, args.config, calib=calib, options=options.from_arguments(args), progress=say
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
