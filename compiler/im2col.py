"""A strided convolution of few input channels as one MATMUL over its taps (im2col).

Without this a convolution of stride > 1 takes one MATMUL per output row and tap (compiler/spatial.py),
each over one input pixel's channels: a 3-channel first layer of 3 x 3 taps is 9 MATMULs an output
row whose k is 3 of the array's lanes. Folded, each output pixel's row on chip holds, tap row by tap
row, the `kw` input pixels its taps read (the `kh * kw * cp` elements of its receptive field, border
pixels as padding), so the convolution is a 1 x 1 convolution of stride 1 over that band: one MATMUL
per band and channel chunk. The LOADs gather the band straight from the input (a DMA row of `kw`
pixels per output pixel and tap row; neighbouring rows overlap in DRAM where the stride is smaller
than the kernel), so no copy is made in DRAM.

On the micro core (its MATMULs run from firmware, thousands of cycles an instruction and about a
hundred a run of an A row) stride-1 convolutions fold too: their taps are a MATMUL each otherwise,
where the pipelined cores run them at the array's rate. `auto` folds where the cost model says it
pays (compiler/spatial.py, `fold_pays`).

It is taken where it costs no more matrix steps: one pixel's channels fit one A word (a tap was a
whole k step before), the kernel's taps of one row are contiguous (no dilation across the width),
one group. The input's channel padding is folded too (zero weights); a graph input read only by such
convolutions is laid out without channel padding (compiler/lower.py), so its folded k is exactly the
receptive field's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from npu.arith import cdiv, round_up
from npu.config import NpuConfig
from npu.program import ProgramBuilder
from npu.tensors import Layout
from npu.timing import a_step_bytes, bank_stride

from .quantize import Act

if TYPE_CHECKING:
    from .spatial import Geometry


def folds(cfg: NpuConfig, kernel, strides, dilations, groups: int, cp: int, elem: int) -> bool:
    """Whether a convolution of `kernel` (kh, kw), `strides`, `dilations` and `groups` over an input
    of `cp` elements a pixel (`elem` bytes each) runs with its taps folded into k."""
    kh, kw = kernel
    return (
        groups == 1
        and dilations[1] == 1
        and kh * kw > 1
        and (tuple(strides) != (1, 1) or cfg.core == "micro")
        and cp * a_step_bytes(cfg, elem) <= cfg.lanes
    )


def folded_input(cfg: NpuConfig, ca: int, x: Act, g: Geometry) -> tuple[Act, Geometry]:
    """The folded convolution's input as its MATMULs see it (output pixels of `kh * kw * cp`
    channels, the pitch lane-aligned; its bytes are gathered, `gather_band`) and its 1 x 1 stride-1
    geometry."""
    kv = g.kh * g.kw * x.layout.cp
    e = x.layout.elem
    lay = Layout.hwc((g.n, kv, g.oh, g.ow), ca, cp=bank_stride(cfg, round_up(kv, ca), ca, elem=e), elem=e)
    gv = replace(g, h=g.oh, w=g.ow, kh=1, kw=1, sh=1, sw=1, pt=0, pl=0, pb=0, pr=0, dh=1, dw=1)
    return replace(x, layout=lay), gv


def describe(x: Act, g: Geometry) -> str:
    """The folded receptive field, for the compile report."""
    return f"{g.kh} x {g.kw} x {x.layout.cp}"


def folded_weights(x: Act, g: Geometry, weights: np.ndarray) -> np.ndarray:
    """(Cout, kh * kw * cp, 1, 1) weights of the folded convolution: tap (ky, kx)'s channel c at
    (ky * kw + kx) * cp + chan[c], zero at the input pitch's padding."""
    cp = x.layout.cp
    wv = np.zeros((weights.shape[0], g.kh * g.kw * cp, 1, 1), weights.dtype)
    chan = np.asarray(x.layout.chan)
    for ky in range(g.kh):
        for kx in range(g.kw):
            wv[:, (ky * g.kw + kx) * cp + chan, 0, 0] = weights[:, :, ky, kx]
    return wv


def _columns(x: Act, g: Geometry, x0: int, cols: int) -> list[tuple[int, int, int, int, int]]:
    """Runs of output columns [x0, x0 + cols) whose tap rows have the same border: (first column
    of the run, its length, the first column's first input column, pad bytes left, data bytes,
    pad bytes right) - a column wholly in the border is all padding (no data)."""
    px = x.layout.cp * x.layout.elem
    runs: list = []
    for c in range(cols):
        wi = (x0 + c) * g.sw - g.pl
        lo, hi = max(wi, 0), min(wi + g.kw, g.w)
        edge = ((lo - wi) * px, (hi - lo) * px, (wi + g.kw - hi) * px) if hi > lo else (g.kw * px, 0, 0)
        if runs and tuple(runs[-1][3:]) == edge and edge[1]:
            runs[-1][1] += 1
        else:
            runs.append([c, 1, lo, *edge])
    return [tuple(r) for r in runs]


def _down_columns(g: Geometry, rows: int, cols: int, runs: int) -> bool:
    """Whether `gather_band` takes a LOAD per tap row and column (down the band's rows) rather than
    one per output row, tap row and run of columns: whichever takes fewer."""
    return g.kh * cols <= rows * g.kh * runs


def gather_loads(x: Act, g: Geometry, rows: int, x0: int, cols: int) -> tuple[int, int]:
    """(LOADs, DMA data rows) of `gather_band` for `rows` output rows and columns [x0, x0 + cols)."""
    runs = len(_columns(x, g, x0, cols))
    loads = g.kh * cols if _down_columns(g, rows, cols, runs) else rows * g.kh * runs
    return loads, rows * cols * g.kh


def gather_beats(cfg: NpuConfig, x: Act, g: Geometry) -> int:
    """Bus words of one gathered DMA row (`kw` input pixels)."""
    return cdiv(g.kw * x.layout.cp * x.layout.elem, cfg.bus_bytes)


def gather_band(
    b: ProgramBuilder, x: Act, g: Geometry, n: int, y0: int, rows: int, x0: int, cols: int, buf: int,
    pitch: int, fill: int, label: str,
) -> None:  # fmt: skip
    """The folded band of output rows [y0, y0 + rows), columns [x0, x0 + cols) of frame `n` at `buf`:
    output pixel (r, c)'s row at buf + (r * cols + c) * pitch, tap row ky's `kw` pixels at ky * kw
    * cp elements into it. `x`, `g`: the convolution's own input and geometry; `fill` the padding's
    value (as `spatial._load_band`). One LOAD per tap row and output column (over the band's rows, the
    rows above and below the map as pad rows), or per output row, tap row and run of columns of one
    border, whichever takes fewer."""
    e = x.layout.elem
    px = x.layout.cp * e
    seg = g.kw * px  # a tap row's pixels
    width = x.layout.nchw[3]
    pad = {"pad_value": fill, "pad_i16": int(e == 2 and fill != 0), "label": label}
    runs = _columns(x, g, x0, cols)

    def in_row(r: int, ky: int) -> int:
        return (y0 + r) * g.sh - g.pt + ky * g.dh

    def at(h: int, w: int) -> int:
        return x.addr + ((n * g.h + h) * width + w) * px

    if _down_columns(g, rows, cols, len(runs)):  # a LOAD per tap row and column, down the band
        for ky in range(g.kh):
            valid = [r for r in range(rows) if 0 <= in_row(r, ky) < g.h]
            r0, r1 = (valid[0], valid[-1] + 1) if valid else (rows, rows)
            for c0, length, lo, left, data, right in runs:
                for c in range(c0, c0 + length):
                    w = lo + (c - c0) * g.sw
                    spad = buf + c * pitch + ky * seg
                    if r1 > r0 and data:
                        b.add("load", spad=spad, dram=at(in_row(r0, ky), w), rows=r1 - r0, cols=data,
                              spad_stride=cols * pitch, dram_stride=g.sh * width * px, pad_top=r0,
                              pad_bottom=rows - r1, pad_left=left, pad_right=right, **pad)  # fmt: skip
                    else:
                        b.add("load", spad=spad, rows=0, cols=0, pad_top=rows, pad_left=seg,
                              spad_stride=cols * pitch, **pad)  # fmt: skip
        return
    for r in range(rows):
        for ky in range(g.kh):
            h = in_row(r, ky)
            spad = buf + r * cols * pitch + ky * seg
            if not 0 <= h < g.h:  # a row above or below the map: its tap row is all padding
                for c in range(0, cols, 255):
                    b.add("load", spad=spad + c * pitch, rows=0, cols=0, pad_top=min(255, cols - c),
                          pad_left=seg, spad_stride=pitch, **pad)  # fmt: skip
                continue
            for c0, length, lo, left, data, right in runs:
                b.add("load", spad=spad + c0 * pitch, dram=at(h, lo) if data else 0,
                      rows=length if data else 0, cols=data, spad_stride=pitch, dram_stride=g.sw * px,
                      pad_top=0 if data else length, pad_left=left, pad_right=right, **pad)  # fmt: skip
