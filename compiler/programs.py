"""Program generators of the compiler's back end, also used by examples, tests and benchmarks.

`gemm_program` writes a tiled, double-buffered int8 GEMM with requantisation and optional ReLU:
C[m, n] = clamp(zp_out + round((A[m, k] . B[k, n]) * mult >> shift), lo, hi), with A row-major and
B given transposed (B^T is n x k, row-major, as ONNX Gemm weights with transB=1 or Conv weights).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from npu.arith import round_up
from npu.config import ACC_BASE, NpuConfig
from npu.isa import PER_COL_MAX, make
from npu.program import BuiltProgram, ProgramBuilder
from npu.sim.golden.kernels import requant
from npu.timing import bank_stride, duration

from . import bias as biasmm


def row_stride(cfg: NpuConfig, k: int) -> int:
    """Scratchpad row stride of a k-byte operand row: lanes-aligned and, on a banked scratchpad, not a
    multiple of the banks per region in lane words (so a tile's rows fall into different banks)."""
    return bank_stride(cfg, round_up(k, cfg.lanes), cfg.lanes)


def acc_row_stride(cfg: NpuConfig, n: int) -> int:
    """Accumulator row stride of n int32 columns: whole accumulator rows and, when banked, not a
    multiple of the banks per half in rows (so the clusters' C rows fall into different banks)."""
    row = cfg.acc_row_bytes
    return bank_stride(cfg, round_up(4 * n, row), row, word=row)


@dataclass(frozen=True)
class GemmTiling:
    tm: int
    tn: int
    tk: int


def choose_tiling(cfg: NpuConfig, m: int, n: int, k: int, ea: int = 1, ey: int = 1) -> GemmTiling:
    """Largest tiles that fit double-buffered: prefer whole N (B^T loaded once per N tile), then M.
    `ea`, `ey`: bytes of an A and an output element (int16 activations: 2)."""
    cm, cn = cfg.clusters, cfg.pes_per_cluster
    best = None
    for tk in sorted(
        {min(round_up(k, cfg.lanes), t) for t in (4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8, cfg.lanes)},
        reverse=True,
    ):
        if tk < cfg.lanes:
            continue
        for tn in range(round_up(min(n, 1024), cn), 0, -cn):
            acc_rows = cfg.acc_bytes // (2 * acc_row_stride(cfg, tn))
            tm = min(round_up(m, cm), (acc_rows // cm) * cm)
            if tm < cm:
                continue
            while tm >= cm:
                if cfg.spad_banked:  # activations in the lower half, weights in the upper half
                    half, rs, ra = cfg.spad_half, row_stride(cfg, tk), row_stride(cfg, ea * tk)
                    fits = 2 * tm * ra + 2 * tm * tn * ey <= half and 2 * tn * rs <= cfg.spad_bytes - half
                else:
                    fits = 2 * tm * tk * ea + 2 * tn * tk + 2 * tm * tn * ey <= cfg.spad_bytes
                if fits:
                    break
                tm -= cm
            if tm < cm:
                continue
            score = (tk >= k, tn >= n, tm * tn * tk)
            if best is None or score > best[0]:
                best = (score, GemmTiling(tm, tn, tk))
        if best is not None and best[0][0]:
            break
    if best is None:
        raise ValueError(f"no GEMM tiling of {m}x{n}x{k} fits configuration {cfg.name}")
    return best[1]


#: channels past the last one a per-column table covers (padding channels of an output tile)
PER_COL_SLACK = 64


@dataclass(frozen=True)
class PerColumn:
    """A per-channel requantisation table at `base` in the scratchpad: `n` int32 multipliers, then
    `n` shifts (docs/isa.md, per-column VMAP)."""

    base: int
    n: int


def per_column_table(cfg: NpuConfig, mult, shift) -> tuple[NpuConfig, PerColumn | None, bytes]:
    """For per-channel scales with more than one (mult, shift) pair: the configuration to plan the
    operator with (the scratchpad less the table, which sits at its top), the table's place and
    its bytes (channels past the last take its pair). Otherwise (`cfg`, None, b""): one VMAP per
    run of equal columns. On a banked scratchpad the table sits at the top of the upper half (the
    weights'), whose start stays where the banks put it."""
    if np.ndim(mult) == 0 or len(set(zip(mult, shift, strict=True))) < 2:
        return cfg, None, b""
    from .region import planning_view  # the planners' view of a smaller scratchpad

    c = len(mult)
    n = round_up(c, 64) + PER_COL_SLACK
    m = np.full(n, int(mult[-1]), np.int64)
    sh = np.full(n, int(shift[-1]), np.int64)
    m[:c], sh[:c] = mult, shift
    data = m.astype("<i4").tobytes() + sh.astype(np.uint8).tobytes()
    base = cfg.spad_bytes - round_up(len(data), cfg.lanes)
    half = cfg.spad_half
    lo = half if cfg.spad_banked else 0  # the region the table takes from: the weights' when banked
    if base - lo < (cfg.spad_bytes - lo) // 2:  # a small one: the table would take too much of it
        return cfg, None, b""
    view = planning_view(cfg, spad_bytes=base, bank_half=lo)  # banked: the halves stay the engine's
    return view, PerColumn(base, n), data


@functools.lru_cache(maxsize=4096)  # asked for every tiling the planner weighs
def bias_load_cycles(cfg: NpuConfig, m: int, n: int) -> int:
    """The load unit's cycles for a tile's bias LOAD (its row for each of m pixels), as the golden
    model times it (with the DRAM's own word and bursts where the configuration has them)."""
    i = make("load", spad=ACC_BASE, dram=0, rows=m, cols=4 * n, spad_stride=acc_row_stride(cfg, n),
             dram_stride=0)  # fmt: skip
    return duration(i, cfg)


def bias_matmul(
    cfg: NpuConfig,
    block: int,
    k: int,
    col: int,
    c: int,
    m: int,
    n: int,
    c_stride: int,
    digits: int | None = None,
) -> dict:
    """The fields of the MATMUL whose m x n accumulators at `c` start as the bias (compiler/bias.py):
    the block's A row at `block` for every row, by the `k` digits of columns `col`.. (a convolution's
    bands and a GEMM's C tiles). The digits follow the A row in the block, or are at `digits` (a
    banked scratchpad keeps them in the weights' half, apart from the A row's banks)."""
    pitch = biasmm.row_pitch(cfg.lanes)
    b0 = block + biasmm.a_bytes(cfg.lanes) if digits is None else digits
    return dict(a=block, b=b0 + col * pitch, c=c, m=m, n=n, k=k, a_stride=0, b_stride=pitch,
                c_stride=c_stride, accumulate=0, a_i16=1)  # fmt: skip


@functools.lru_cache(maxsize=4096)
def bias_matmul_cycles(cfg: NpuConfig, m: int, n: int, k: int) -> int:
    """The matrix unit's cycles for a tile's bias MATMUL (compiler/bias.py), as the golden model
    times it; 0 without digits."""
    if not k:
        return 0
    digits = cfg.spad_half if cfg.spad_banked else None  # banked: the digits in the other half
    fields = bias_matmul(cfg, 0, k, 0, ACC_BASE, m, n, acc_row_stride(cfg, n), digits)
    return duration(make("matmul", **fields), cfg)


@dataclass(frozen=True)
class BiasBlock:
    """A GEMM's bias resident in the scratchpad as the operands of a MATMUL (compiler/bias.py): the
    block at `base`, `k` digits a column, the GEMM's column 0 at digit row `col0`."""

    base: int
    k: int
    col0: int = 0


def bias_block(cfg: NpuConfig, bias: np.ndarray) -> tuple[NpuConfig, BiasBlock | None, bytes]:
    """For a GEMM's int32 bias (every column's, possibly of several GEMMs after each other): the
    configuration to plan it with (the scratchpad less the block, which sits at its top), the block's
    place and its bytes; (`cfg`, None, b"") where the digits cannot hold the bias, the scratchpad
    is banked (fixed halves, as for `per_column_table`) or the block would take too much of it.
    Whether a tile takes it is `bias_by_matmul`'s question, once the tiling is known."""
    d = None if cfg.spad_banked else biasmm.digits(bias)
    if d is None:
        return cfg, None, b""
    from .region import planning_view

    data = biasmm.block(d, cfg.lanes)
    base = cfg.spad_bytes - round_up(len(data), cfg.lanes)
    if base < cfg.spad_bytes // 2:
        return cfg, None, b""
    return planning_view(cfg, spad_bytes=base), BiasBlock(base, d.shape[1]), data


def bias_by_matmul(cfg: NpuConfig, t: GemmTiling, k: int, tiles: int, block_bytes: int) -> bool:
    """The rule convolutions follow (`spatial.plan_conv`): the bias as a MATMUL of `k` digits where
    the `tiles` MATMULs take at most half the cycles of their LOADs, less the block's own LOAD."""
    n = block_bytes
    block = make("load", spad=0, dram=0, rows=1, cols=n, spad_stride=n, dram_stride=n)
    mm, load = bias_matmul_cycles(cfg, t.tm, t.tn, k), bias_load_cycles(cfg, t.tm, t.tn)
    return 2 * mm * tiles <= load * tiles - duration(block, cfg)


def plan_gemm_bias(
    cfg: NpuConfig,
    bias: np.ndarray,
    tiling_for: Callable[[NpuConfig], GemmTiling],
    mn: tuple[int, int],
    gemms: int = 1,
) -> tuple[GemmTiling, BiasBlock | None, bytes]:
    """A GEMM's tiling (`tiling_for` a planning configuration, raising ValueError where none fits)
    and, where `bias_by_matmul` takes it for `gemms` GEMMs of `mn` = (m, n), its bias block and the
    block's bytes (the caller loads them to `block.base` once, before the GEMMs)."""
    plan_cfg, block, data = bias_block(cfg, bias)
    if block is not None:
        try:
            t = tiling_for(plan_cfg)
        except ValueError:
            pass
        else:
            tiles = gemms * -(-mn[0] // t.tm) * -(-mn[1] // t.tn)
            if bias_by_matmul(cfg, t, block.k, tiles, len(data)):
                return t, block, data
    return tiling_for(cfg), None, b""


def add_requant(b: ProgramBuilder, rq: dict, ch0: int, *, src: int, dst: int, cols: int, **fields) -> None:
    """VMAP(s) from int32 accumulator columns of channels ch0 .. ch0 + cols - 1 to int8 (int16 with
    `dst_i16` in `rq`). `rq`: the
    requantisation fields, with `mult`/`shift` either one value or one per channel (per-channel
    weight scales): then, with a table (`per_col`, a PerColumn), per-column VMAPs of at most
    PER_COL_MAX columns, else one VMAP per run of columns that share them. Columns past the
    arrays' end are padding channels and take the last channel's pair."""
    mult, shift = rq["mult"], rq["shift"]
    rest = {k: v for k, v in rq.items() if k not in ("mult", "shift", "per_col")}
    e = 2 if rq.get("dst_i16") else 1  # bytes of an output element
    pc: PerColumn | None = rq.get("per_col")
    if pc is not None:
        assert ch0 + cols <= pc.n, (ch0, cols, pc.n)
        for c0 in range(0, cols, PER_COL_MAX):
            w = min(PER_COL_MAX, cols - c0)
            at = ch0 + c0
            b.add("vmap", src=src + 4 * c0, dst=dst + e * c0, cols=w, src_type=1, per_col=1,
                  mults=pc.base + 4 * at, shifts=pc.base + 4 * pc.n + at, **rest, **fields)  # fmt: skip
        return
    if np.ndim(mult) == 0 and np.ndim(shift) == 0:
        pairs = [(int(mult), int(shift))] * cols
    else:
        last = len(mult) - 1
        pairs = [(int(mult[min(ch0 + c, last)]), int(shift[min(ch0 + c, last)])) for c in range(cols)]
    c0 = 0
    for c in range(1, cols + 1):
        if c == cols or pairs[c] != pairs[c0]:
            m, s = pairs[c0]
            b.add("vmap", src=src + 4 * c0, dst=dst + e * c0, cols=c - c0, src_type=1, mult=m, shift=s,
                  **rest, **fields)  # fmt: skip
            c0 = c


def gemm_program(
    cfg: NpuConfig,
    m: int,
    n: int,
    k: int,
    a_addr: int,
    bt_addr: int,
    c_addr: int,
    *,
    mult: int | np.ndarray = 1,
    shift: int | np.ndarray = 0,
    zp_out: int = 0,
    relu: bool = False,
    tiling: GemmTiling | None = None,
    cancel_every: int = 0,
    bias_addr: int | None = None,
    builder: ProgramBuilder | None = None,
    cp_base: int = 0,
    per_col: PerColumn | None = None,
    out_i32: bool = False,
    ea: int = 1,
    ey: int = 1,
    a_row: int | None = None,
    bt_row: int | None = None,
    bt_col: int = 1,
    bias_mm: BiasBlock | None = None,
) -> BuiltProgram | None:
    """Tiled GEMM + requantise (+ ReLU) program; a cancellation point after every
    `cancel_every` output tiles (0: none). `mult`/`shift`: one pair, or one per output column.
    `bias_addr`: n int32 values in DRAM added to every row (preloaded into the accumulators). With
    `builder`, the instructions are appended to it and nothing is returned (the caller builds).
    `per_col`: per-channel `mult`/`shift` from a table already in the scratchpad
    (`per_column_table`; plan with the configuration it returns). `out_i32`: C is stored as it is
    (m x n int32, no requantisation). `ea`, `ey`: bytes of an A and an output element (int16
    activations: 2). `a_row`, `bt_row`: bytes between rows of A and of B^T in DRAM (default: dense,
    `k` elements); `bt_col`: bytes between B^T's elements along k (1: its rows are contiguous; else
    each B^T row is loaded as a column, one byte a DMA row: a transposed activation operand).
    `bias_mm`: the bias block already on chip (`bias_block`): each C tile starts as the bias by a
    MATMUL of it instead of `bias_addr`'s LOAD."""
    t = tiling or choose_tiling(cfg, m, n, k, ea, ey)
    a_row = k * ea if a_row is None else a_row
    bt_row = k if bt_row is None else bt_row
    b = builder if builder is not None else ProgramBuilder(cfg)
    a_stride_sp = row_stride(cfg, t.tk * ea)
    b_stride_sp = row_stride(cfg, t.tk)
    a_buf = [0, t.tm * a_stride_sp]
    # a banked scratchpad keeps weights (B^T) in its upper half, apart from the activations' banks
    b_base = cfg.spad_half if cfg.spad_banked else 2 * t.tm * a_stride_sp
    b_buf = [b_base, b_base + t.tn * b_stride_sp]
    o_base = (
        2 * t.tm * a_stride_sp if cfg.spad_banked else round_up(b_base + 2 * t.tn * b_stride_sp, cfg.lanes)
    )
    o_buf = [o_base, o_base + t.tm * t.tn * ey]

    def load_rows(
        spad: int, dram: int, rows: int, cols: int, label: str, stride: int, e: int, row: int
    ) -> None:
        """An operand tile: `rows` rows of `cols` elements of `e` bytes, `row` bytes apart in DRAM."""
        b.add(
            "load",
            spad=spad,
            dram=dram,
            rows=rows,
            cols=cols * e,
            spad_stride=stride,
            dram_stride=row,
            label=label,
        )

    def load_bt(spad: int, n0: int, k0: int, tn: int, tk: int, label: str) -> None:
        """A B^T tile: rows n0.. of k elements k0.., as rows or (`bt_col` > 1) column by column."""
        if bt_col == 1:
            load_rows(spad, bt_addr + n0 * bt_row + k0, tn, tk, label, b_stride_sp, 1, bt_row)
            return
        for j in range(tn):
            b.add("load", spad=spad + j * b_stride_sp, dram=bt_addr + (n0 + j) * bt_row + k0 * bt_col,
                  rows=tk, cols=1, spad_stride=1, dram_stride=bt_col, label=f"{label} row {j}")  # fmt: skip

    c_stride = acc_row_stride(cfg, t.tn)
    c_buf = [ACC_BASE, ACC_BASE + round_up(t.tm, cfg.clusters) * c_stride]
    lo = zp_out if relu else -128
    ksplit = k > t.tk
    tiles = cp = it = n_bload = n_aload = 0
    for ni, n0 in enumerate(range(0, n, t.tn)):
        tn = min(t.tn, n - n0)
        if not ksplit:  # B^T tile stays on chip for the whole N tile
            bb = b_buf[ni % 2]
            load_bt(bb, n0, 0, tn, k, f"load B n{n0}")
        for m0 in range(0, m, t.tm):
            tm = min(t.tm, m - m0)
            cbuf = c_buf[it % 2]
            if bias_mm is not None:  # the bias's digits times the block's A row, for every row
                fields = bias_matmul(cfg, bias_mm.base, bias_mm.k, bias_mm.col0 + n0, cbuf, tm, tn, c_stride)
                b.add("matmul", **fields, label=f"bias m{m0} n{n0}")
            elif bias_addr is not None:  # every row of the C tile starts as the bias
                b.add(
                    "load",
                    spad=cbuf,
                    dram=bias_addr + 4 * n0,
                    rows=tm,
                    cols=4 * tn,
                    spad_stride=c_stride,
                    dram_stride=0,
                    label=f"bias m{m0} n{n0}",
                )
            for k0 in range(0, k, t.tk):
                tk = min(t.tk, k - k0)
                if ksplit:
                    bb = b_buf[n_bload % 2]
                    n_bload += 1
                    load_bt(bb, n0, k0, tn, tk, f"load B n{n0} k{k0}")
                ab = a_buf[n_aload % 2]
                n_aload += 1
                a_at = a_addr + m0 * a_row + k0 * ea
                load_rows(ab, a_at, tm, tk, f"load A m{m0} k{k0}", a_stride_sp, ea, a_row)
                b.add(
                    "matmul",
                    a=ab,
                    b=bb,
                    c=cbuf,
                    m=tm,
                    n=tn,
                    k=tk,
                    a_stride=a_stride_sp,
                    b_stride=b_stride_sp,
                    c_stride=c_stride,
                    accumulate=int(k0 > 0 or bias_addr is not None or bias_mm is not None),
                    a_i16=int(ea == 2),
                    label=f"matmul m{m0} n{n0} k{k0}",
                )
            rq = None
            if not out_i32:
                rq = dict(mult=mult, shift=shift, zp_out=zp_out, lo=lo, hi=127, per_col=per_col)
                if ey == 2:  # int16 output: the clamp bounds its high byte (ReLU: 0)
                    rq.update(dst_i16=1, lo=0 if relu else -128)
            _gemm_output(b, rq, cbuf, o_buf[it % 2], c_addr, m0, n0, tm, tn, n, c_stride, ey)
            it += 1
            tiles += 1
            last = n0 + t.tn >= n and m0 + t.tm >= m
            if cancel_every and tiles % cancel_every == 0 and not last:
                b.cancel_point(cp_base + cp)
                cp += 1
            elif not last:
                b.candidate()
    return None if builder is not None else b.build()


def _gemm_output(b, rq, cbuf, obuf, c_addr, m0, n0, tm, tn, n, c_stride, ey) -> None:
    """A C tile to DRAM: the accumulator rows as they are (`rq` None), or requantised first."""
    if rq is None:  # the accumulator rows go to DRAM as they are
        b.add(
            "store",
            spad=cbuf,
            dram=c_addr + 4 * (m0 * n + n0),
            rows=tm,
            cols=4 * tn,
            spad_stride=c_stride,
            dram_stride=4 * n,
            label=f"store C m{m0} n{n0}",
        )
        return
    add_requant(
        b,
        rq,
        n0,
        src=cbuf,
        dst=obuf,
        rows=tm,
        cols=tn,
        src_stride=c_stride,
        dst_stride=tn * ey,
        label=f"requant m{m0} n{n0}",
    )
    b.add(
        "store",
        spad=obuf,
        dram=c_addr + (m0 * n + n0) * ey,
        rows=tm,
        cols=tn * ey,
        spad_stride=tn * ey,
        dram_stride=n * ey,
        label=f"store m{m0} n{n0}",
    )


def gemm_reference(
    a: np.ndarray, bt: np.ndarray, *, mult: int = 1, shift: int = 0, zp_out: int = 0, relu: bool = False
) -> np.ndarray:
    """numpy reference of `gemm_program` (int8 in, int8 out)."""
    acc = a.astype(np.int64) @ bt.astype(np.int64).T
    acc = acc.astype(np.int32).astype(np.int64)
    return requant(acc, mult, shift, zp_out, zp_out if relu else -128, 127).astype(np.int8)


def gemm_requant(k: int) -> tuple[int, int]:
    """A multiplier/shift that maps a typical k-long int8 dot product back into int8 range."""
    scale = 1.0 / (128.0 * np.sqrt(k) / 3)
    shift = 24
    return max(1, int(round(scale * (1 << shift)))), shift
