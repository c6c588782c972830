"""Cycle costs of unit instructions: the rules docs/isa.md ("Timing") states, in one place.

The golden model uses these to schedule its pipeline; the compiler uses them as its cost model.
"""

from __future__ import annotations

import numpy as np

from npu.config import ACC_BASE, NpuConfig
from npu.isa import LUT_BYTES, Instr, Opcode

from .arith import cdiv

#: Channel cycles a write burst takes besides its beats: the memory takes the next burst's address
#: only once this one's response has been taken (hdl/simdram.py), so bursts do not overlap.
WRITE_BURST_CYCLES = 2
#: A STORE's cycles besides its bursts: issuing the first address, taking the last response.
STORE_CYCLES = 2


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


def dma_bursts(addr: int, rows: int, cols: int, stride: int, bus: int) -> int:
    """AXI bursts the load and store units split a transfer into: each row's bus words, split at
    256 beats and at 4 KiB boundaries (hdl/load.py, hdl/store.py)."""
    if rows == 0 or cols == 0:
        return 0
    if cdiv(bus - 1 + cols, bus) <= 256 and cols <= 4096:
        # a row is one burst, or two when it crosses a 4 KiB boundary
        a = (addr + np.arange(rows, dtype=np.int64) * stride) % 4096
        return rows + int(np.count_nonzero(a - a % bus + cdiv(a % bus + cols, bus) * bus > 4096))
    total = 0
    for r in range(rows):
        a = addr + r * stride
        start, end = a - a % bus, a + cols
        while start < end:
            start += min(cdiv(end - start, bus), 256, (4096 - start % 4096) // bus) * bus
            total += 1
    return total


def spad_bank(g: np.ndarray, cfg: NpuConfig, mem: str = "spad") -> np.ndarray:
    """Bank of word `g` of the scratchpad (lane words) or the accumulators (`mem` "acc": rows of
    bus_bytes) in a banked configuration (hdl/spad.py): two regions (lower and upper half) of
    spad_banks / 2 banks, words interleaved modulo that count."""
    P = cfg.spad_banks // 2
    half = (cfg.spad_bytes // cfg.lanes if mem == "spad" else cfg.acc_bytes // cfg.bus_bytes) // 2
    return (g // half) * P + (g % half) % P


def bank_stride(cfg: NpuConfig, stride: int, unit: int, word: int | None = None) -> int:
    """A row stride (a multiple of `unit`) that, in a banked configuration, is not a multiple of the
    banks per region in words (`word` bytes, lanes by default), so a tile's rows fall into different
    banks: `stride`, or `stride + unit` when it would be. Unchanged without banking."""
    word = word or cfg.lanes
    if cfg.spad_banked and stride and (stride // word) % (cfg.spad_banks // 2) == 0:
        return stride + unit
    return stride


def _most_per_bank(banks: np.ndarray, valid: np.ndarray, nbanks: int) -> np.ndarray:
    """Per row of `banks` (..., readers): the largest number of valid readers sharing one bank."""
    onehot = (banks[..., None] == np.arange(nbanks)) & valid[..., None]
    return onehot.sum(axis=-2).max(axis=-1)


def banked_matmul_steps(f: dict, cfg: NpuConfig) -> int:
    """Cycles of a MATMUL's steps on banked memories: each step takes as many cycles as the most
    operand reads one scratchpad bank serves (rows past m or n are not read); the bank pattern of a
    tile shifts by one bank per k step, so it is counted at k step 0 for every tile. At a tile's last
    k step the C rows are read (when accumulating) and written, one per accumulator bank a cycle."""
    CM, CN, L = cfg.clusters, cfg.pes_per_cluster, cfg.lanes
    MB, NB, KB = cdiv(f["m"], CM), cdiv(f["n"], CN), max(1, cdiv(f["k"], L))
    nbanks = cfg.spad_banks
    ra = np.arange(MB)[:, None] * CM + np.arange(CM)
    rb = np.arange(NB)[:, None] * CN + np.arange(CN)
    ba = spad_bank((f["a"] + ra * f["a_stride"]) // L, cfg)
    bb = spad_bank((f["b"] + rb * f["b_stride"]) // L, cfg)
    ca = ((ba[..., None] == np.arange(nbanks)) & (ra < f["m"])[..., None]).sum(axis=1).astype(np.int32)
    cb = ((bb[..., None] == np.arange(nbanks)) & (rb < f["n"])[..., None]).sum(axis=1).astype(np.int32)
    # C rows (accumulators): written at the last k step, each bank taking one a cycle (stage 1 holds
    # for the rest); read at that step too when accumulating
    W = cfg.bus_bytes
    rc = (f["c"] - ACC_BASE) // W + ra * (f["c_stride"] // W)  # (MB, CM) word of each C row at nb = 0
    total = 0
    for m0 in range(0, MB, 256):  # bounded memory for very tall MATMULs
        step = (ca[m0 : m0 + 256, None, :] + cb[None, :, :]).max(axis=2)  # (mb, nb)
        words = rc[m0 : m0 + 256, None, :] + np.arange(NB)[None, :, None]  # (mb, nb, CM)
        valid = np.broadcast_to((ra[m0 : m0 + 256] < f["m"])[:, None, :], words.shape)
        cmult = _most_per_bank(spad_bank(words, cfg, "acc"), valid, nbanks)
        last = np.maximum(step, cmult) if f["accumulate"] else step
        total += int(step.sum()) * (KB - 1) + int(last.sum()) + int((cmult - 1).clip(0).sum())
    return total


def banked_vector_steps(
    a: int, b: int, rows: int, cols: int, a_stride: int, b_stride: int, cfg: NpuConfig
) -> int:
    """Cycles of the steps of a two-operand vector instruction (VADD: one row; VMUL) on a banked
    scratchpad: a step reads one or two lane words of each operand and takes as many cycles as the
    most of them one bank serves."""
    VL, L = cfg.vector_lanes, cfg.lanes
    per_row = cdiv(cols, VL)
    off = np.tile(np.arange(per_row) * VL, rows)
    row = np.repeat(np.arange(rows), per_row)
    n = np.minimum(VL, cols - off)
    words, valid = [], []
    for base, stride in ((a, a_stride), (b, b_stride)):
        addr = base + row * stride + off
        g = addr // L
        words += [g, g + 1]
        valid += [np.ones(len(off), bool), addr % L + n > L]
    return int(_most_per_bank(spad_bank(np.stack(words, 1), cfg), np.stack(valid, 1), cfg.spad_banks).sum())


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
        args = (f["dram"], f["rows"], f["cols"], f["dram_stride"], cfg.bus_bytes)
        beats = dma_beats(*args)
        return STORE_CYCLES + beats + WRITE_BURST_CYCLES * dma_bursts(*args) if beats else 1
    if op == Opcode.MATMUL:
        if cfg.spad_banked and f["m"] and f["n"]:
            return cfg.matrix_latency + max(1, banked_matmul_steps(f, cfg))
        steps = cdiv(f["m"], cfg.clusters) * cdiv(f["n"], cfg.pes_per_cluster) * cdiv(f["k"], cfg.lanes)
        return cfg.matrix_latency + max(1, steps)
    if op == Opcode.VMAP:
        steps = f["rows"] * cdiv(f["cols"], cfg.vector_lanes)
        if f["per_col"] and steps:  # the multipliers' and shifts' steps come first
            steps += cdiv(4 * f["cols"], cfg.vector_lanes) + cdiv(f["cols"], cfg.vector_lanes)
        return cfg.vector_latency + max(1, steps)
    if op == Opcode.VLUT:  # the table's steps, then the elements'
        steps = f["rows"] * cdiv(f["cols"], cfg.vector_lanes)
        return cfg.vector_latency + (LUT_BYTES // cfg.vector_lanes + steps if steps else 1)  # as VMAP
    if op == Opcode.VMUL:
        if cfg.spad_banked and f["rows"] and f["cols"]:
            rc = (f["rows"], f["cols"], f["a_stride"], f["b_stride"])
            return cfg.vector_latency + banked_vector_steps(f["a"], f["b"], *rc, cfg)
        return cfg.vector_latency + max(1, f["rows"] * cdiv(f["cols"], cfg.vector_lanes))
    if op == Opcode.VADD:
        if cfg.spad_banked and f["len"]:
            return cfg.vector_latency + banked_vector_steps(f["a"], f["b"], 1, f["len"], 0, 0, cfg)
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
