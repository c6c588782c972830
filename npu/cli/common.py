"""What the commands share: the error they raise, number parsing, reading and checking programs."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..asm import Assembly, parse_int, read_asm
from ..isa import ErrorCode, IsaError, decode_program, validate


class CliError(Exception):
    """A user error; `main` prints it as `npu: error: ...` and exits with 2."""


def number(text: str) -> int:
    """An argparse type: decimal, 0x hex or 0b binary."""
    try:
        return parse_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def load_program(path: str) -> Assembly:
    """An Assembly from a `.s` file or a raw binary (no directives)."""
    p = Path(path)
    if not p.exists():
        raise CliError(f"{path}: no such file")
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
