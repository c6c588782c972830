"""A 1 x 1 convolution computed on each band of the depthwise convolution that alone feeds it.

Apart, a depthwise layer stores its result and the 1 x 1 layer after it loads it back: on a board's
16-bit SDRAM that map crosses the memory twice. Here the depthwise operator's bands each end with
the 1 x 1 layer's MATMUL over the band's requantised tile, still on chip, its own requantisation and
the store of its result; the depthwise result is never stored. The 1 x 1 layer's weights and bias
stay on chip for the operator, at the top of the scratchpad (a banked one's weights' half), with its
output tiles and its accumulator tile: the depthwise layer is planned for what is left
(`reserve`). The values are the two operators' (the same MATMULs and VMAPs on the same codes).
docs/compiler.md, "Depthwise and 1 x 1 as one operator".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npu.arith import round_up
from npu.config import ACC_BASE, NpuConfig
from npu.isa import make
from npu.program import ProgramBuilder
from npu.timing import bank_stride, duration

from . import bias as biasmm
from .programs import acc_row_stride, add_requant, bias_matmul
from .quantize import Act
from .region import planning_view


@dataclass(frozen=True)
class Pointwise:
    """The 1 x 1 convolution after a depthwise one: int8 `weights` (cout, cin), its int64 `bias`
    with its input's zero point folded in, its requantisation `rq` (VMAP fields) and its output."""

    weights: np.ndarray
    bias: np.ndarray
    rq: dict
    y: Act
    name: str


@dataclass(frozen=True)
class Places:
    """Where the 1 x 1 layer's data sits on chip: its weights (B^T rows `b_stride` apart), its bias
    block (or, where the digits cannot hold it, the bias row's DRAM address: `block` None), its two
    output tiles and its accumulator tile."""

    w: int
    b_stride: int
    k: int  # the input channels the MATMUL reads (not the pitch's bank padding)
    block: int | None
    digits: int
    out: tuple[int, int]
    acc: int | None
    resident: int = 0  # bytes on chip for the whole operator (its weights and bias block)


def reserve(cfg: NpuConfig, pw: Pointwise, cpx: int, k: int, reuse: bool) -> tuple[NpuConfig, Places] | None:
    """The configuration to plan the depthwise layer with (`cpx` channels: its output, the 1 x 1
    layer's input, of which the first `k` can be nonzero) and the 1 x 1 layer's places at the top
    of the scratchpad; None where they would leave the depthwise layer less than a quarter of it
    (of a banked one's weights' half). The accumulators: the depthwise layer's two tiles and the
    1 x 1 layer's one of as many pixels, or (`reuse`, where its rows are no wider) the 1 x 1 layer
    accumulates in its band's depthwise tile once that is requantised: taller bands, but the next
    band but one's depthwise MATMULs then wait for the 1 x 1 layer's requantisation."""
    cpy, ey = pw.y.layout.cp, pw.y.layout.elem
    a_row, p_row = acc_row_stride(cfg, cpx), acc_row_stride(cfg, cpy)
    if reuse and p_row > a_row:
        return None
    m_cap = cfg.acc_bytes // (2 * a_row + (0 if reuse else p_row))
    b_stride = bank_stride(cfg, round_up(cpx, cfg.lanes), cfg.lanes)
    digits = biasmm.digits(_bias(pw))
    block = 0 if digits is None else biasmm.a_bytes(cfg.lanes) + cpy * biasmm.row_pitch(cfg.lanes)
    sizes = [cpy * b_stride, block, m_cap * cpy * ey, m_cap * cpy * ey]
    top = cfg.spad_bytes
    base = top - sum(round_up(s, cfg.lanes) for s in sizes)
    lo = cfg.spad_half if cfg.spad_banked else 0
    if m_cap < 1 or base - lo < (top - lo) // 4:
        return None
    at = [base + sum(round_up(s, cfg.lanes) for s in sizes[:i]) for i in range(len(sizes))]
    halves = {"bank_half": lo} if lo else {}
    view = planning_view(cfg, spad_bytes=base, acc_bytes=2 * a_row * m_cap, **halves)
    return view, Places(w=at[0], b_stride=b_stride, k=k, block=at[1] if block else None,
                        digits=0 if digits is None else digits.shape[1], out=(at[2], at[3]),
                        acc=None if reuse else ACC_BASE + 2 * a_row * m_cap,
                        resident=sizes[0] + sizes[1])  # fmt: skip


def _bias(pw: Pointwise) -> np.ndarray:
    """The bias of every output column (channel padding: 0)."""
    bias = np.zeros(pw.y.layout.cp, np.int64)
    bias[: len(pw.bias)] = pw.bias
    return bias


@dataclass
class Fused:
    """The 1 x 1 layer as the depthwise operator's output pass emits it: its bias row's DRAM address
    where there is no block, and the bands emitted so far (their output tiles alternate)."""

    pw: Pointwise
    pl: Places
    cfg: NpuConfig
    bias_dram: int = 0
    bands: int = 0
    pending: tuple | None = None  # the band whose 1 x 1 layer is emitted after the next band's MATMULs

    def flush(self, b: ProgramBuilder) -> None:
        """Emit the last band's 1 x 1 layer (at the operator's end)."""
        if self.pending is not None:
            _emit(b, self, *self.pending)
            self.pending = None


def resident(b: ProgramBuilder, cfg: NpuConfig, pw: Pointwise, pl: Places, cpx: int, const) -> Fused:
    """The LOADs of the 1 x 1 layer's weights and bias block, on chip for the operator (constants
    made with `const`)."""
    cpy = pw.y.layout.cp
    w = np.zeros((cpy, cpx), np.int8)  # B^T: a row an output channel, its input channels' weights
    w[: pw.weights.shape[0], : pw.weights.shape[1]] = pw.weights
    b.add("load", spad=pl.w, dram=const(w.tobytes(), f"{pw.name} weights"), rows=cpy, cols=cpx,
          dram_stride=cpx, spad_stride=pl.b_stride, label="weights (1 x 1)")  # fmt: skip
    bias = _bias(pw)
    if pl.block is None:
        return Fused(pw, pl, cfg, const(bias.astype("<i4").tobytes(), f"{pw.name} bias"))
    data = biasmm.block(biasmm.digits(bias), cfg.lanes)
    b.add("load", spad=pl.block, dram=const(data, f"{pw.name} bias digits"), rows=1, cols=len(data),
          spad_stride=len(data), dram_stride=len(data), label="bias digits (1 x 1)")  # fmt: skip
    return Fused(pw, pl, cfg)


def band(b: ProgramBuilder, f: Fused, rq: dict, acc: tuple[int, int], a: int, cpx: int, ex: int, m: int,
         out: tuple) -> None:  # fmt: skip
    """One band: the depthwise layer's accumulators (`acc`: where, row stride; `m` rows) requantised
    by `rq` into the tile at `a` (`cpx` elements of `ex` bytes a pixel), its output rows' pixels back
    to back (a band's rows hold pixel slots past the output's width); then the 1 x 1 layer over that
    tile (`_emit`). `out`: (the output's geometry, the band's strip geometry, frame, first output
    row, first output column, rows, pixel slots an output row takes on chip). The 1 x 1 layer is
    emitted after the next band's depthwise MATMULs (at the next band's output, or `flush`): the
    matrix unit then runs those while the vector unit requantises this band's tile."""
    g, gs, n, y0, x0, rows, wv = out
    src, c_stride = acc
    if wv == gs.ow:
        add_requant(b, rq, 0, src=src, dst=a, rows=m, cols=cpx, src_stride=c_stride, dst_stride=cpx * ex)
    else:
        for r in range(rows):
            add_requant(b, rq, 0, src=src + r * wv * c_stride, dst=a + r * gs.ow * cpx * ex, rows=gs.ow,
                        cols=cpx, src_stride=c_stride, dst_stride=cpx * ex)  # fmt: skip
    f.flush(b)
    f.pending = (a, cpx, ex, m if wv == gs.ow else rows * gs.ow, out, src)


def _emit(b: ProgramBuilder, f: Fused, a: int, cpx: int, ex: int, m: int, out: tuple, src: int) -> None:
    """The 1 x 1 layer of a band: its accumulators started as the bias, its MATMUL over the tile at
    `a` (`m` pixels), its requantisation into an output tile and that tile's store."""
    g, gs, n, y0, x0, rows, wv = out
    pw, pl, cfg = f.pw, f.pl, f.cfg
    cpy, ey = pw.y.layout.cp, pw.y.layout.elem
    c_stride = acc_row_stride(cfg, cpy)
    acc = src if pl.acc is None else pl.acc
    if pl.block is not None:
        b.add("matmul", **bias_matmul(cfg, pl.block, pl.digits, 0, acc, m, cpy, c_stride))
    else:
        b.add("load", spad=acc, dram=f.bias_dram, rows=m, cols=4 * cpy, spad_stride=c_stride,
              dram_stride=0, label="bias (1 x 1)")  # fmt: skip
    b.add("matmul", a=a, b=pl.w, c=acc, m=m, n=cpy, k=pl.k, a_stride=cpx * ex, b_stride=pl.b_stride,
          c_stride=c_stride, accumulate=1, a_i16=int(ex == 2))  # fmt: skip
    po = pl.out[f.bands % 2]
    f.bands += 1
    add_requant(b, pw.rq, 0, src=acc, dst=po, rows=m, cols=cpy, src_stride=c_stride, dst_stride=cpy * ey)
    at = (((n * g.oh + y0) * g.ow + x0) * cpy) * ey
    if gs.ow == g.ow and m * cpy * ey <= 0xFFFF:  # whole output rows: the band's pixels back to back
        b.add("store", spad=po, dram=pw.y.addr + at, rows=1, cols=m * cpy * ey, spad_stride=m * cpy * ey,
              dram_stride=m * cpy * ey, label="output (1 x 1)")  # fmt: skip
    else:
        b.add("store", spad=po, dram=pw.y.addr + at, rows=rows, cols=gs.ow * cpy * ey,
              spad_stride=gs.ow * cpy * ey, dram_stride=g.ow * cpy * ey, label="output (1 x 1)")  # fmt: skip


def cycles(cfg: NpuConfig, pw: Pointwise, pl: Places, cpx: int, ex: int, m: int, bands: int) -> int:
    """The matrix unit's cycles for the 1 x 1 layer over `bands` bands of `m` pixel rows (its bias
    and its MATMUL), as the golden model times them: what it adds to the depthwise layer's estimate;
    where it accumulates in the depthwise tiles, also its requantisation, which the matrix unit
    then waits for every band."""
    cpy = pw.y.layout.cp
    c_stride = acc_row_stride(cfg, cpy)
    acc = ACC_BASE if pl.acc is None else pl.acc
    mm = make("matmul", a=0, b=pl.w, c=acc, m=m, n=cpy, k=pl.k, a_stride=cpx * ex, b_stride=pl.b_stride,
              c_stride=c_stride, accumulate=1, a_i16=int(ex == 2))  # fmt: skip
    per = duration(mm, cfg)
    if pl.block is not None:
        start = bias_matmul(cfg, pl.block, pl.digits, 0, acc, m, cpy, c_stride)
        per += duration(make("matmul", **start), cfg)
    if pl.acc is None:
        ey = pw.y.layout.elem
        vmap = make("vmap", src=acc, dst=pl.out[0], rows=m, cols=cpy, src_stride=c_stride,
                    dst_stride=cpy * ey, src_type=1, dst_i16=int(ey == 2))  # fmt: skip
        per += duration(vmap, cfg)
    return bands * per
