"""`npu asm`: assemble a .s file to a binary program."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..asm import read_asm
from ..config import get_config
from ..files import write_atomic
from ..isa import INSTR_BYTES
from .common import CliError, output_file, validate_all

HELP = "assemble a .s file to a binary program"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="assembly file (.s)")
    p.add_argument("-o", "--output", help="output file (default: SOURCE with .bin)")
    p.add_argument("--config", help="also check every rule of this configuration (default: .config)")


def run(args: argparse.Namespace) -> int:
    asm = read_asm(args.source)
    if not asm.instrs:
        raise CliError(f"{args.source}: no instructions")
    cfg_name = args.config or asm.config
    if cfg_name:
        validate_all(asm, get_config(cfg_name))
    out = output_file(args.output or Path(args.source).with_suffix(".bin"))
    write_atomic(out, asm.binary())
    print(f"{args.source}: {len(asm.instrs)} instructions, {len(asm.instrs) * INSTR_BYTES} bytes -> {out}")
    return 0
