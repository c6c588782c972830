"""`npu run`: a program on the golden model (assembly or binary), or a compiled .npub model on the
model or the RTL core, printing outputs and counters."""

from __future__ import annotations

import argparse
import json
import zipfile
from pathlib import Path

import numpy as np

from ..config import PRESETS, get_config
from ..files import replacing
from ..isa import ErrorCode
from .common import CliError, input_file, int_in, load_program, number, output_file, validate_all

HELP = "run a program on the golden model, print outputs and counters"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help=".s file (with .data/.output directives) or binary")
    p.add_argument("--config", help=f"one of {', '.join(PRESETS)} (default: the file's .config)")
    p.add_argument(
        "--backend",
        default="model",
        choices=["model", "rtl", "serial"],
        help="execution backend (rtl: an .npub model on the simulated core through the driver; "
        "serial: on a board through its UART bridge, --port)",
    )
    p.add_argument("--port", help="serial: the board's UART (/dev/ttyUSB1, or a pyserial URL)")
    p.add_argument("--baud", type=int_in(1), default=115200, help="serial: baud rate (default 115200)")
    p.add_argument(
        "--base", type=int_in(0, 2**32 - 1), default=0, help="DRAM address of the program (default 0)"
    )
    p.add_argument("--dram", action="append", metavar="FILE.npy@ADDR", help="preload DRAM")
    p.add_argument(
        "--output",
        action="append",
        metavar="NAME@ADDR:DTYPE:SHAPE",
        help="read a result back, e.g. C@0x40000:i8:64x64 (for an .npub model: the output file, y.npy)",
    )
    p.add_argument(
        "--pause-at",
        type=int_in(0),
        action="append",
        metavar="CYCLE",
        help="request a pause at this cycle, then resume (repeatable)",
    )
    p.add_argument("--max-cycles", type=int_in(1), help="give up after this many cycles")
    p.add_argument("--save", metavar="OUT.npz", help="save outputs (.npz: every output by name; for an .npub "
                   "also OUT.npy: its outputs as OUT.npy, OUT.1.npy, ...)")
    p.add_argument("--input", action="append", metavar="X.npy", help="an .npub model's float input")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _run_npub(args: argparse.Namespace) -> int:
    from npu.container import Container, ContainerError
    from npu.sim.golden.runner import RunError, run_container

    try:
        c = Container.load(args.program)
    except ContainerError as e:
        raise CliError(str(e)) from None
    cfg = get_config(args.config or c.manifest.config)
    if not args.input:
        raise CliError(f"{args.program}: give the model's input with --input x.npy")
    xs = []
    for path in args.input:
        try:
            xs.append(np.load(path))
        except (OSError, ValueError) as e:
            raise CliError(f"--input {path}: cannot read: {e}") from None
    from npu.driver.jobs import run_model

    try:
        if args.backend == "serial":
            from npu.driver.transport import TransportError

            if not args.port:
                raise CliError("--backend serial needs --port (the board's UART, e.g. /dev/ttyUSB1)")
            from npu.driver.serial import SerialTransport

            try:
                transport = SerialTransport(cfg, port=args.port, baud=args.baud)
            except TransportError as e:
                raise CliError(f"--port {args.port}: {e}") from None
            try:
                outs, counters = run_model(transport, c, xs)
            finally:
                transport.close()
        elif args.backend == "rtl":
            from npu.sim.rtl.transport import DEFAULT_DRAM, run_on_rtl

            dram = min(cfg.dram_bytes, DEFAULT_DRAM)
            outs, counters = run_on_rtl(run_model, c, xs, config=cfg, dram_bytes=dram)
        else:
            outs, counters = run_container(c, xs, cfg)
    except RunError as e:
        raise CliError(f"{args.program}: {e}") from None
    if args.output:  # for a compiled model: --output y.npy (several outputs: y.npy, y.1.npy, ...)
        if len(args.output) != 1 or "@" in args.output[0]:
            raise CliError("for an .npub model, give one --output FILE.npy")
        args.save = str(output_file(args.output[0]))
    if args.save:
        _save_outputs(Path(args.save), [t.name for t in c.manifest.outputs], outs)
    print(
        f"{args.program} on {cfg.name}: {counters['CYCLES']:,} cycles "
        f"({counters['CYCLES'] / cfg.clock_mhz:,.1f} us at {cfg.clock_mhz:g} MHz)"
    )
    with np.printoptions(threshold=60, edgeitems=3, linewidth=100, precision=4):
        for t, y in zip(c.manifest.outputs, outs, strict=True):
            print(f"{t.name}: {y.dtype} {'x'.join(map(str, y.shape))}")
            print(y)
    if args.save:
        print(f"output saved to {args.save}")
    return 0


def _write_npz(path: str | Path, arrays: dict[str, np.ndarray]) -> None:
    """An .npz as np.savez writes one, whatever the names (savez takes `file` and `allow_pickle` as
    options, not arrays)."""
    with replacing(path) as tmp, zipfile.ZipFile(tmp, "w") as z:
        for name, y in arrays.items():
            with z.open(f"{name}.npy", "w") as fh:
                np.lib.format.write_array(fh, np.asanyarray(y), allow_pickle=False)


def _save_outputs(base: Path, names: list[str], outs: list[np.ndarray]) -> None:
    """OUT.npz: every output under its name; else OUT.npy (several: OUT.npy, OUT.1.npy, ...). Written
    through file objects: np.save adds its suffix to a path without it, which left the data in a
    hidden temporary file and an empty OUT.npz."""
    if base.suffix == ".npz":
        _write_npz(base, dict(zip(names, outs, strict=True)))
        return
    for i, y in enumerate(outs):
        with replacing(base if i == 0 else base.with_suffix(f".{i}.npy")) as tmp, open(tmp, "wb") as fh:
            np.save(fh, y)


def _fmt_counters(c: dict[str, int]) -> str:
    return "\n".join(f"  {k.lower():<15} {v:>12,}" for k, v in c.items())


def run(args: argparse.Namespace) -> int:
    from npu.sim.golden.runner import RunError, run_assembly

    input_file(args.program)
    if args.save:
        output_file(args.save)
    if args.program.endswith(".npub"):
        return _run_npub(args)
    if args.backend != "model":
        raise CliError(f"--backend {args.backend} runs compiled .npub models; assembly runs on the model")
    asm = load_program(args.program)
    cfg = get_config(args.config or asm.config or "default")
    for spec in args.dram or []:
        from ..asm import DataInit

        path, _, addr = spec.rpartition("@")
        if not path:
            raise CliError(f"--dram {spec!r}: write FILE.npy@ADDR")
        input_file(path)
        try:
            addr = number(addr)
        except argparse.ArgumentTypeError as e:
            raise CliError(f"--dram {spec!r}: {e}") from None
        asm.data.append(DataInit(addr, "file", path=str(Path(path).resolve())))
    for spec in args.output or []:
        from ..asm import Output, parse_dtype, parse_shape

        try:
            name, rest = spec.split("@", 1)
            addr, dtype, shape = rest.split(":")
            asm.outputs.append(Output(name, number(addr), parse_dtype(dtype), parse_shape(shape)))
        except (ValueError, argparse.ArgumentTypeError) as e:
            raise CliError(f"--output {spec!r}: write NAME@ADDR:DTYPE:SHAPE ({e})") from None
    validate_all(asm, cfg)
    try:
        res = run_assembly(asm, cfg, base=args.base, pause_at=args.pause_at, max_cycles=args.max_cycles)
    except RunError as e:
        raise CliError(str(e)) from None
    if args.save:
        _write_npz(args.save if args.save.endswith(".npz") else args.save + ".npz", res.outputs)
    if args.json:
        print(
            json.dumps(
                {
                    "program": args.program,
                    "config": cfg.name,
                    "status": res.status.name,
                    "error": ErrorCode(res.error_code).name,
                    "error_pc": res.error_pc,
                    "counters": res.counters,
                    "wall_s": round(res.wall_s, 6),
                    "pauses": [{"cp_id": a, "resume_pc": b} for a, b in res.pauses],
                    "outputs": {k: v.tolist() for k, v in res.outputs.items()},
                }
            )
        )
    else:
        print(f"{args.program} on {cfg.describe()}")
        print(
            f"status: {res.status.name}"
            + (f" ({ErrorCode(res.error_code).name} at pc {res.error_pc})" if res.error_code else "")
        )
        for cp, pc in res.pauses:
            print(f"paused at cancellation point {cp}, resumed at pc {pc}")
        with np.printoptions(threshold=200, edgeitems=4, linewidth=100):
            for name, arr in res.outputs.items():
                print(f"{name}: {arr.dtype} {'x'.join(map(str, arr.shape))}")
                print(arr)
        print("counters:")
        print(_fmt_counters(res.counters))
        us = res.counters["CYCLES"] / cfg.clock_mhz
        print(f"  = {us:,.1f} us at {cfg.clock_mhz:g} MHz; simulated in {res.wall_s:.3f} s")
        if args.save:
            print(f"outputs saved to {args.save}")
    return 0 if res.status.name == "DONE" else 1
