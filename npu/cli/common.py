"""What the commands share: the error they raise, number parsing, reading and checking programs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from npu.errors import NpuError

from ..asm import Assembly, parse_int, read_asm
from ..isa import ErrorCode, IsaError, decode_program, validate


class CliError(NpuError):
    """A user error; `main` prints it as `npu: error: ...` and exits with 2."""


def number(text: str) -> int:
    """An argparse type: decimal, 0x hex or 0b binary."""
    try:
        return parse_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer (decimal, 0x, 0b) in lo..hi."""

    def parse(text: str) -> int:
        v = number(text)
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{text} is out of range ({lo}..{'' if hi is None else hi})")
        return v

    return parse


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (0 < v < float("inf")):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number > 0")
    return v


def input_file(path: str) -> Path:
    """`path` as an existing regular file, or a CliError that says what it is instead."""
    p = Path(path)
    if p.is_dir():
        raise CliError(f"{path}: is a directory, not a file")
    if not p.exists():
        raise CliError(f"{path}: no such file")
    return p


def output_file(path: str | Path) -> Path:
    """`path` as a writable file name: not a directory, in a folder that exists."""
    p = Path(path)
    if p.is_dir():
        raise CliError(f"{path}: is a directory; give a file name")
    if not p.parent.is_dir():
        raise CliError(f"{path}: the folder {p.parent} does not exist")
    return p


def load_program(path: str) -> Assembly:
    """An Assembly from a `.s` file or a raw binary (no directives)."""
    p = input_file(path)
    if p.suffix in (".s", ".asm"):
        return read_asm(p)
    blob = p.read_bytes()
    try:
        instrs = decode_program(blob)
    except IsaError as e:
        raise CliError(f"{path}: {e}") from None
    return Assembly(instrs=instrs, lines=list(range(len(instrs))), source=str(p))


def validate_all(asm: Assembly, cfg) -> None:
    """Check every instruction against `cfg`; the error names the source line (or pc)."""
    for n, (ins, line) in enumerate(zip(asm.instrs, asm.lines, strict=False)):
        try:
            validate(ins, cfg)
        except IsaError as e:
            where = f"{asm.source}:{line}" if asm.source.endswith((".s", ".asm")) else f"{asm.source}: pc {n}"
            raise CliError(f"{where}: {e} [{ErrorCode(e.code).name} on {cfg.name}]") from None
