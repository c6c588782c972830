"""`npu disasm`: a binary, .s or .npub program as canonical assembly; for an .npub, annotated with
its segments, layers, cancellation points and host steps."""

from __future__ import annotations

import argparse
import sys

from ..asm import disassemble
from ..isa import decode_program
from .common import CliError, load_program

HELP = "print a binary, .s or .npub program as canonical assembly"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="binary, .s or compiled .npub")
    p.add_argument("--pc", action="store_true", help="annotate each line with its pc")


def run(args: argparse.Namespace) -> int:
    if args.program.endswith(".npub"):
        from ..container import Container, ContainerError, HostStep, NpuSegment

        try:
            c = Container.load(args.program)
        except ContainerError as e:
            raise CliError(str(e)) from None
        instrs = decode_program(c.blobs["program"])
        notes: dict[int, list[str]] = {}
        man = c.manifest
        for i, seg in enumerate(man.segments):
            if isinstance(seg, NpuSegment):
                notes.setdefault(seg.pc, []).append(f"segment {i}: NPU program from pc {seg.pc}")
        for i, layer in enumerate(man.layers):
            if layer.pc is not None:
                notes.setdefault(layer.pc[0], []).append(
                    f"layer {i}: {layer.op} {layer.node or ''} {layer.shape}"
                )
        for cp in man.cancel_points:
            notes.setdefault(cp.pc, []).append(f"cancellation point {cp.id}, live bytes {cp.live_bytes}")
        for prev, seg in zip(man.segments, man.segments[1:], strict=False):
            if isinstance(seg, HostStep) and isinstance(prev, NpuSegment):
                notes.setdefault(prev.end, []).append(f"then host step: {', '.join(seg.nodes)}")
        text = {pc: "; ".join(v) for pc, v in notes.items()}
        sys.stdout.write(disassemble(instrs, annotate=text, show_pc=args.pc))
        return 0
    asm = load_program(args.program)
    sys.stdout.write(disassemble(asm.instrs, show_pc=args.pc))
    return 0
