"""Cycle costs of unit instructions: the rules docs/isa.md ("Timing") states, in one place.

The golden model uses these to schedule its pipeline; the compiler uses them as its cost model.
"""

from __future__ import annotations

from npu.config import NpuConfig
from npu.isa import Instr, Opcode


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def dma_beats(addr: int, rows: int, cols: int, stride: int, bus: int) -> int:
    """AXI beats to move `rows` rows of `cols` bytes: each row covers the bus words it touches."""
    if rows == 0 or cols == 0:
        return 0
    if stride % bus == 0:
        return rows * cdiv(addr % bus + cols, bus)
    total = 0
    for r in range(rows):
        total += cdiv((addr + r * stride) % bus + cols, bus)
    return total


def duration(i: Instr, cfg: NpuConfig) -> int:
    """Cycles a unit is busy with one instruction (>= 1)."""
    f = i.fields
    op = i.op
    if op == Opcode.LOAD:
        beats = dma_beats(f["dram"], f["rows"], f["cols"], f["dram_stride"], cfg.bus_bytes)
        tr = f["pad_top"] + f["rows"] + f["pad_bottom"]
        tw = f["pad_left"] + f["cols"] + f["pad_right"]
        pad_bytes = tr * tw - f["rows"] * f["cols"]
        data = cfg.dma_latency + beats if beats else 0
        return max(1, data + cdiv(pad_bytes, cfg.bus_bytes))
    if op == Opcode.STORE:
        beats = dma_beats(f["dram"], f["rows"], f["cols"], f["dram_stride"], cfg.bus_bytes)
        return max(1, cfg.dma_latency + beats if beats else 1)
    if op == Opcode.MATMUL:
        steps = cdiv(f["m"], cfg.clusters) * cdiv(f["n"], cfg.pes_per_cluster) * cdiv(f["k"], cfg.lanes)
        return cfg.matrix_latency + max(1, steps)
    if op == Opcode.VMAP:
        return cfg.vector_latency + max(1, f["rows"] * cdiv(f["cols"], cfg.vector_lanes))
    if op == Opcode.VADD:
        return cfg.vector_latency + max(1, cdiv(f["len"], cfg.vector_lanes))
    if op == Opcode.POOL:
        steps = f["out_h"] * f["out_w"] * f["kh"] * f["kw"] * cdiv(f["channels"], cfg.vector_lanes)
        return cfg.vector_latency + max(1, steps)
    if op == Opcode.SYNC:
        return 1
    return 0


def dma_bytes(i: Instr) -> tuple[int, int]:
    """(bytes read from DRAM, bytes written to DRAM) by an instruction."""
    if i.op == Opcode.LOAD:
        return i.rows * i.cols, 0
    if i.op == Opcode.STORE:
        return 0, i.rows * i.cols
    return 0, 0


def ideal_matmul_cycles(m: int, n: int, k: int, cfg: NpuConfig) -> float:
    return m * n * k / cfg.macs_per_cycle
