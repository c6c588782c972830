"""`npu disasm`: a binary, .s or .npub program as canonical assembly; for an .npub, annotated with
its segments, layers, cancellation points and host steps."""

from __future__ import annotations

import argparse
import sys

from ..asm import disassemble
from ..config import config_by_id
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
                note = f"segment {i}: NPU program from pc {seg.pc}{_figures(seg)}"
                notes.setdefault(seg.pc, []).append(note)
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
        cfg = config_by_id(c.config_id)
        if (man.spad_region or man.acc_region) and cfg is not None:
            (s0, s1), (a0, a1) = man.onchip_ranges(cfg)
            where = f"on-chip regions: scratchpad [0x{s0:x}, 0x{s1:x}), accumulators [0x{a0:x}, 0x{a1:x})"
            notes.setdefault(0, []).insert(0, where)
        text = {pc: "; ".join(v) for pc, v in notes.items()}
        sys.stdout.write(disassemble(instrs, annotate=text, show_pc=args.pc))
        return 0
    asm = load_program(args.program)
    sys.stdout.write(disassemble(asm.instrs, show_pc=args.pc))
    return 0


def _figures(seg) -> str:
    """A segment's cost-model figures, when the container has them (newer compilers)."""
    if seg.spad_bytes is None:
        return ""
    return (
        f" (est {seg.est_cycles} cycles: compute {seg.compute_cycles}, DMA {seg.dma_cycles}; "
        f"DMA {seg.dma_rd_bytes} B read, {seg.dma_wr_bytes} B written; on chip {seg.spad_bytes} B "
        f"scratchpad, {seg.acc_bytes} B accumulators)"
    )
