"""The rules a container's manifest must keep before anything of it runs (docs/container.md,
"Checks"): every DRAM address the model touches lies in its own image, [0, program.base + program
bytes), so a model placed in its region cannot reach another model's memory; DRAM images do not
overlap each other, the program or a tensor; numbers are in range; references point at what exists.

`check_container` raises ContainerError naming the field (`manifest.dram[1].addr`, ...) and the
value. The driver runs it in `Npu.load` and the golden model's runner before writing DRAM."""

from __future__ import annotations

import functools
import math

import numpy as np

from .config import NpuConfig
from .container import Container, ContainerError, HostStep, Manifest, NpuSegment, TensorDesc
from .isa import INSTR_BYTES, IsaError, Opcode, decode, footprint

#: zero points each element size can hold (int8, int16, int32)
_ZP_RANGE = {1: (-128, 127), 2: (-32768, 32767), 4: (-(2**31), 2**31 - 1)}


def check_container(c: Container, cfg: NpuConfig | None = None, source: str = "") -> None:
    """Every rule above; with `cfg`, also the on-chip ranges of the cancellation points and that the
    model fits the device's DRAM."""
    where = f"{source}: manifest" if source else "manifest"
    man = c.manifest
    program = c.blobs["program"]
    base = man.program.base
    if base < 0 or base % INSTR_BYTES:
        raise ContainerError(f"{where}.program.base: {base} is not a non-negative multiple of {INSTR_BYTES}")
    if len(program) != man.program.instructions * INSTR_BYTES:
        raise ContainerError(
            f"{where}.program.instructions: {man.program.instructions}, but the program blob holds "
            f"{len(program)} bytes ({len(program) / INSTR_BYTES:g} instructions)"
        )
    if cfg is not None and base + len(program) > cfg.dram_bytes:
        raise ContainerError(
            f"{where}.program: the model's image ends at {base + len(program)}, beyond the "
            f"{cfg.dram_bytes} bytes of DRAM of {cfg.name}"
        )
    images = _check_images(man, c.blobs, where)
    _check_tensors(man, images, where)
    _check_segments(man, np.frombuffer(program, np.uint8)[::INSTR_BYTES] & 0xF, where)
    _check_points(man, cfg, where)
    _check_program(program, base, where)


def _span(where: str, start: int, size: int, limit: int, what: str) -> tuple[int, int]:
    if start < 0 or start + size > limit:
        raise ContainerError(
            f"{where}: [{start}, {start + size}) is outside the model's data [0, {limit}) below its "
            f"program ({what})"
        )
    return start, start + size


def _check_images(man: Manifest, blobs: dict[str, bytes], where: str) -> list[tuple[int, int, str]]:
    spans = []
    for i, d in enumerate(man.dram):
        s, e = _span(f"{where}.dram[{i}].addr", d.addr, len(blobs[d.blob]), man.program.base, d.blob)
        for s2, e2, name in spans:
            if s < e2 and s2 < e:
                raise ContainerError(
                    f"{where}.dram[{i}]: {d.blob} at [{s}, {e}) overlaps {name} at [{s2}, {e2})"
                )
        spans.append((s, e, f"manifest.dram {d.blob}"))
    return spans


def _tensor_fields(man: Manifest, where: str) -> list[tuple[str, TensorDesc]]:
    named = [(f"{where}.inputs[{i}]", t) for i, t in enumerate(man.inputs)]
    named += [(f"{where}.outputs[{i}]", t) for i, t in enumerate(man.outputs)]
    for k, s in enumerate(man.segments):
        if isinstance(s, HostStep):
            for part in ("inputs", "quantize"):
                named += [(f"{where}.segments[{k}].{part}[{i}].tensor", io.tensor)
                          for i, io in enumerate(getattr(s, part))]  # fmt: skip
    return [(w, t) for w, t in named if isinstance(t, TensorDesc)]


def _check_tensors(man: Manifest, images: list[tuple[int, int, str]], where: str) -> None:
    for side in ("inputs", "outputs"):
        names = [t.name for t in getattr(man, side)]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ContainerError(f"{where}.{side}: {dup!r} appears twice")
    for w, t in _tensor_fields(man, where):
        if not t.shape or min(t.shape) < 1:
            raise ContainerError(f"{w}.shape: {t.shape} must list dimensions >= 1")
        lay = t.layout
        if min(lay.shape, default=0) < 1 or math.prod(t.shape) != math.prod(lay.shape):
            raise ContainerError(f"{w}.layout: shape {list(lay.shape)} does not hold the tensor's {t.shape}")
        if lay.kind not in ("dense", "perm") and (
            len(lay.chan) != lay.nchw[1] or max(lay.chan, default=0) >= lay.cp
        ):
            raise ContainerError(f"{w}.layout: channels {list(lay.chan)[:8]} do not fit the pitch {lay.cp}")
        lo, hi = _ZP_RANGE[lay.elem] if t.scales is None else (0, 0)  # accumulators: scales[c] x q
        if not lo <= t.zero_point <= hi:
            raise ContainerError(f"{w}.zero_point: {t.zero_point} is outside [{lo}, {hi}]")
        for k, sc in enumerate([t.scale, *(t.scales or [])]):
            if not (math.isfinite(sc) and sc > 0):
                field = "scale" if k == 0 else f"scales[{k - 1}]"
                raise ContainerError(f"{w}.{field}: {sc} is not a positive finite number")
        s, e = _span(f"{w}.addr", t.addr, lay.nbytes, man.program.base, t.name)
        for s2, e2, name in images:
            if s < e2 and s2 < e:
                raise ContainerError(f"{w}: {t.name} at [{s}, {e}) overlaps {name} at [{s2}, {e2})")


def _check_segments(man: Manifest, ops: np.ndarray, where: str) -> None:
    """Segments exist, each NPU segment's range ends with END inside the program (the device cannot
    run past it into other memory), and dependencies point at earlier segments."""
    if not man.segments:
        raise ContainerError(f"{where}.segments: empty (nothing to run)")
    n = man.program.instructions
    for k, s in enumerate(man.segments):
        w = f"{where}.segments[{k}]"
        if isinstance(s, NpuSegment):
            if not 0 <= s.pc <= s.end < n:
                raise ContainerError(f"{w}: pc {s.pc}, end {s.end} is not a range of the {n} instructions")
            if ops[s.end] != Opcode.END:
                raise ContainerError(f"{w}.end: instruction {s.end} is not END")
        for d in s.deps or []:
            if not 0 <= d < k:
                raise ContainerError(f"{w}.deps: {d} is not an earlier segment (0..{k - 1})")
        if s.deps is not None and len(set(s.deps)) < len(s.deps):
            raise ContainerError(f"{w}.deps: {s.deps} lists a segment twice")
        _non_negative(s, w)
    for k, la in enumerate(man.layers):
        _non_negative(la, f"{where}.layers[{k}]")
        if la.pc is not None and (len(la.pc) != 2 or not 0 <= la.pc[0] <= la.pc[1] <= n):
            raise ContainerError(f"{where}.layers[{k}].pc: {la.pc} is not a range of the {n} instructions")


def _non_negative(obj: object, where: str) -> None:
    """Cycle and byte figures (the schedulers' inputs) are counts: none is negative."""
    for name in ("est_cycles", "ref_cycles", "compute_cycles", "dma_cycles", "spad_bytes", "acc_bytes",
                 "dma_rd_bytes", "dma_wr_bytes"):  # fmt: skip
        v = getattr(obj, name, None)
        if v is not None and v < 0:
            raise ContainerError(f"{where}.{name}: {v} is negative")


def _check_points(man: Manifest, cfg: NpuConfig | None, where: str) -> None:
    ids = set()
    onchip = man.onchip_ranges(cfg) if cfg is not None else None
    for k, p in enumerate(man.cancel_points):
        w = f"{where}.cancel_points[{k}]"
        if p.id in ids:
            raise ContainerError(f"{w}.id: {p.id} appears twice")
        ids.add(p.id)
        if not 0 <= p.pc < man.program.instructions:
            raise ContainerError(f"{w}.pc: {p.pc} is outside the {man.program.instructions} instructions")
        if not 0 <= p.segment < len(man.segments):
            raise ContainerError(f"{w}.segment: {p.segment} is not one of the {len(man.segments)} segments")
        for name in ("live_bytes", "est_cycles", "dump_cycles", "restore_cycles"):
            if getattr(p, name) < 0:
                raise ContainerError(f"{w}.{name}: {getattr(p, name)} is negative")
        if p.est_first_start is not None and p.est_first_start < 0:
            raise ContainerError(f"{w}.est_first_start: {p.est_first_start} is negative")
        total = 0
        for i, r in enumerate(p.live_ranges):
            inside = onchip is None or any(a <= r[0] and r[1] <= b for a, b in onchip)
            if len(r) != 2 or r[0] > r[1] or not inside:
                raise ContainerError(f"{w}.live_ranges[{i}]: {r} is not a range of the model's on-chip data")
            total += r[1] - r[0]
        if total > p.live_bytes:
            raise ContainerError(f"{w}.live_bytes: {p.live_bytes}, but its ranges hold {total} bytes")


def _check_program(program: bytes, base: int, where: str) -> None:
    """Every LOAD reads and every STORE writes inside the model's data, [0, program.base). (An
    instruction that does not decode is left to the device, which stops on it with an error.)"""
    bad = _dram_outside(bytes(program), base)  # bytes(b) is b itself: hashed once
    if bad:
        pc, kind, start, end = bad
        raise ContainerError(
            f"{where}.program: pc {pc}: {kind} DRAM [{start}, {end}), outside the model's data [0, {base})"
        )


@functools.lru_cache(maxsize=8)
def _dram_outside(program: bytes, base: int) -> tuple[int, str, int, int] | None:
    """The first LOAD or STORE reaching DRAM outside [0, base), or None; cached, as a compiled
    model run on many inputs checks its one program each time."""
    ops = np.frombuffer(program, np.uint8)[::INSTR_BYTES] & 0xF
    for pc in np.flatnonzero((ops == Opcode.LOAD) | (ops == Opcode.STORE)):
        try:
            ins = decode(program[pc * INSTR_BYTES : (pc + 1) * INSTR_BYTES])
        except IsaError:
            continue
        reads, writes = footprint(ins)
        for span in reads + writes:
            if span.space == "dram" and not (0 <= span.start and span.end <= base):
                return (
                    int(pc),
                    "LOAD reads" if ins.op == Opcode.LOAD else "STORE writes",
                    span.start,
                    span.end,
                )
    return None
