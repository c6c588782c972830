"""Convolution and pooling on HWC activations: tiling (operator splitting) and code generation.

Splitting follows the design's rule per operator type. A convolution is split by frame first, then by
output channel (and input channel, accumulating, when one output channel's weights are too big),
then by height into row bands with halos (`kh - stride` rows shared by neighbouring bands). Pooling
reduces over height and width, so it is split by frame, channel and then row bands.

A convolution is a sum over kernel taps of matrix products: for tap (ky, kx) the A operand is the
input band shifted by (ky, kx), one row per output pixel, `a_stride = stride * channel pitch`; B^T is
that tap's weights (output channel x input channel). With stride 1 one MATMUL per tap covers a whole
band: output pixel (r, x) uses A row `r * Wp + x` (Wp the padded width), so the `kw - 1` columns past
the right edge are computed and dropped by the store. Otherwise there is one MATMUL per output row
and tap. Borders are the padding of the LOAD (the input zero point), so they add nothing.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import numpy as np

from npu.arith import cdiv, round_up
from npu.compiler.programs import acc_row_stride, add_requant, bias_matmul
from npu.compiler.programs import bias_load_cycles as _bias_load_cycles
from npu.compiler.programs import bias_matmul_cycles as _bias_matmul_cycles
from npu.config import ACC_BASE, NpuConfig
from npu.isa import INSTR_BYTES, LUT_BYTES
from npu.program import ProgramBuilder
from npu.timing import a_pitch, a_planes, a_sharing, a_step_bytes, bank_stride, dram_cycles

from . import bias as biasmm
from . import im2col, pointwise
from .elementwise import OutputPass
from .graph import CompileError
from .quantize import Act, quant_multiplier
from .region import memory_name


def channel_align(cfg: NpuConfig) -> int:
    """Channel pitch unit of HWC tensors: MATMUL needs `lanes`-aligned A rows, `pes`-aligned C rows."""
    return math.lcm(cfg.lanes, cfg.pes_per_cluster)


def spad_regions(cfg: NpuConfig) -> tuple[int, int]:
    """(bytes for activations, base of the weights): a banked scratchpad keeps MATMUL weights in its
    upper half, apart from the activations' banks (docs/isa.md, Timing); otherwise both share it."""
    half = cfg.spad_half
    return (half, half) if cfg.spad_banked else (cfg.spad_bytes, 0)


@dataclass
class Geometry:
    n: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    pb: int
    pr: int
    dh: int = 1  # dilation: kernel taps dh rows and dw columns apart
    dw: int = 1

    @property
    def wp(self) -> int:
        return self.w + self.pl + self.pr

    @property
    def ekh(self) -> int:
        """Rows one output row reads (the dilated kernel's extent)."""
        return (self.kh - 1) * self.dh + 1

    @property
    def ekw(self) -> int:
        return (self.kw - 1) * self.dw + 1

    def in_rows(self, rows_out: int) -> int:
        return (rows_out - 1) * self.sh + self.ekh

    def strip(self, x0: int, cols: int) -> tuple[Geometry, int]:
        """The geometry of output columns [x0, x0 + cols) and the first input column it reads: the
        strip's own input columns, its left/right padding where it meets the border."""
        left = x0 * self.sw - self.pl
        right = left + (cols - 1) * self.sw + self.ekw
        c0, c1 = max(left, 0), min(right, self.w)
        s = Geometry(self.n, self.h, c1 - c0, self.oh, cols, self.kh, self.kw, self.sh, self.sw,
                     self.pt, c0 - left, self.pb, right - c1, self.dh, self.dw)  # fmt: skip
        return s, c0

    def widest_strip(self, cols: int) -> Geometry:
        """A strip of `cols` output columns without border padding: the largest one (for planning)."""
        return Geometry(self.n, self.h, (cols - 1) * self.sw + self.ekw, self.oh, cols, self.kh, self.kw,
                        self.sh, self.sw, self.pt, 0, self.pb, 0, self.dh, self.dw)  # fmt: skip


def geometry(x: Act, y: Act, kernel, strides, pads, where: str, dilations=(1, 1)) -> Geometry:
    n, _, h, w = x.layout.nchw
    _, _, oh, ow = y.q.shape
    kh, kw = kernel
    sh, sw = strides
    pt, pl, pb, pr = pads[0], pads[1], pads[2], pads[3]
    g = Geometry(n, h, w, oh, ow, kh, kw, sh, sw, pt, pl, pb, pr, *dilations)
    if (h + pt + pb - g.ekh) // sh + 1 != oh or (w + pl + pr - g.ekw) // sw + 1 != ow:
        raise CompileError(f"{where}: output shape {y.q.shape} does not follow from the attributes")
    if max(pt, pb) > 255:
        raise CompileError(f"{where}: vertical padding {max(pt, pb)} exceeds the DMA's 255 rows")
    return g


@dataclass(frozen=True)
class BandPixels:
    """How a convolution's band holds its pixels on chip: `pitch` elements apart (`a_pitch`), each
    row's padded columns in `planes` planes by their remainder mod `planes` (`a_planes`: a strided
    convolution's MATMULs then read adjacent pixels). `phased`: a convolution of stride s = `planes`
    in both directions keeps its rows in s phases too, each phase's rows one after another (plane
    (row phase, column phase) holds `hq` rows of the s x s): the input rows a tap reads for
    consecutive output rows are then consecutive in one plane, so one MATMUL a tap covers the band,
    as at stride 1, its output rows `wv` A rows apart (the plane's width)."""

    pitch: int
    planes: int = 1
    stride: int = 1  # pixels apart on chip of a MATMUL's A rows
    phased: bool = False
    hq: int = 0  # a phased band's rows a plane (its plan's tallest band's)

    @staticmethod
    def of(cfg: NpuConfig, g: Geometry, elems: int, ex: int, planes: int, band_mode: bool, pad: bool = True
           ) -> BandPixels:  # fmt: skip
        """A band of `elems` elements a pixel (`ex` bytes each), its rows in `planes` planes, at the
        pitch `a_pitch` gives (`pad`) or at `elems`."""
        stride = g.sw if planes == 1 and not band_mode else 1
        return BandPixels(a_pitch(cfg, elems, ex, stride) if pad else elems, planes, stride)

    def row(self, wp: int) -> int:
        """Pixels a band row of `wp` padded columns takes."""
        return self.planes * cdiv(wp, self.planes)

    def col(self, j: int, wp: int) -> int:
        """Where padded column `j` of such a row is, in pixels."""
        return (j % self.planes) * cdiv(wp, self.planes) + j // self.planes

    def held(self, in_rows: int) -> int:
        """Rows a band of `in_rows` input rows takes on chip (a phased one's planes are of equal height)."""
        return self.planes * cdiv(in_rows, self.planes) if self.phased else in_rows

    def bytes(self, g: Geometry, rows_out: int, ex: int) -> int:
        """Bytes on chip of a band of `rows_out` output rows of `g`, `ex` bytes an element."""
        return self.held(g.in_rows(rows_out)) * self.row(g.wp) * self.pitch * ex

    def sized(self, g: Geometry, rows_out: int) -> BandPixels:
        """As a plan of bands of `rows_out` output rows lays them out (a phased band's `hq`)."""
        return replace(self, hq=cdiv(g.in_rows(rows_out), self.planes)) if self.phased else self

    def wv(self, g: Geometry, band_mode: bool) -> int:
        """A-row slots an output row of a band takes: the padded width in band mode (a phased band's
        plane width), else the output width."""
        return (cdiv(g.wp, self.planes) if self.phased else g.wp) if band_mode else g.ow

    def at(self, i: int, q: int, wp: int) -> int:
        """Where input row `i` of a phased band starts in column plane `q`, in pixels."""
        s = self.planes
        return (((i % s) * s + q) * self.hq + i // s) * cdiv(wp, s)

    def tap(self, ky: int, kx: int, wp: int) -> int:
        """A phased band's first A row for tap (ky, kx), in pixels."""
        return self.at(ky, kx % self.planes, wp) + kx // self.planes


def _load_band(
    b: ProgramBuilder,
    x: Act,
    g: Geometry,
    n: int,
    y0: int,
    rows_out: int,
    buf: int,
    fill: int,
    label: str,
    col0: int = 0,
    c0: int = 0,
    cl: int = 0,
    px: BandPixels | None = None,
) -> None:
    """Padded input rows for output rows [y0, y0 + rows_out) of frame n at `buf`: all channels, or
    with `cl` the slice of channels [c0, c0 + cl) (a pixel `cl` elements wide on chip: one DMA row
    per pixel, an input row per LOAD, its border pixels as pad rows); `g` may be a strip of the
    tensor's width starting at input column `col0` (Geometry.strip). `px`: how the band holds its
    pixels on chip (`BandPixels`; None: as the tensor does) - a pitch wider than a pixel's data
    (`a_pitch`) is loaded a DMA row a pixel too, columns in planes a LOAD a plane, rows in phases
    each into its plane. `fill`: the padding's int8 value, or for an int16 tensor its high byte (0,
    or -128 for -32768)."""
    pitch, planes = (px.pitch, px.planes) if px is not None else (0, 1)
    phased = px is not None and px.phased
    e = x.layout.elem
    cp = x.layout.cp * e  # bytes of a pixel
    width = x.layout.nchw[3]  # the tensor's row, of which the band reads g.w columns
    top = y0 * g.sh - g.pt  # first input row (may be negative: padding)
    bottom = top + g.in_rows(rows_out)
    pad16 = int(e == 2 and fill != 0)
    cl = cl or x.layout.cp
    if cl * e < cp or pitch * e > cp or planes > 1:
        data_bytes = cl * e  # bytes of a pixel's data
        step = max(pitch * e, data_bytes)  # bytes of a pixel on chip
        wq = cdiv(g.wp, planes)  # pixels of a plane
        row = planes * wq * step  # bytes of a band row on chip
        i = 0
        while i < bottom - top:
            h = top + i
            if 0 <= h < g.h or phased:
                for q in range(planes):  # plane q: padded columns q, q + planes, ...
                    lead = cdiv(g.pl - q, planes) if g.pl > q else 0  # its pixels left of the map
                    j0 = q + lead * planes  # its first column of the map
                    data = cdiv(g.pl + g.w - j0, planes) if j0 < g.pl + g.w and 0 <= h < g.h else 0
                    lead = lead if data else wq  # none of the map's pixels: a row of padding pixels
                    at = px.at(i, q, g.wp) if phased else (i * planes + q) * wq
                    b.add(
                        "load",
                        spad=buf + at * step,
                        dram=(x.addr + ((n * g.h + h) * width + col0 + j0 - g.pl) * cp + c0 * e) * (data > 0),
                        rows=data,
                        cols=data_bytes if data else 0,
                        spad_stride=step,
                        dram_stride=planes * cp,
                        pad_left=0 if data else data_bytes,
                        pad_top=lead,
                        pad_bottom=wq - lead - data,
                        pad_value=fill,
                        pad_i16=pad16,
                        label=label,
                    )
                i += 1
                continue
            # a run of padding rows (above or below the map): one LOAD without data
            run = 1
            while run < 255 and i + run < bottom - top and not 0 <= h + run < g.h:
                run += 1
            b.add("load", spad=buf + i * row, rows=0, cols=0, pad_top=run, pad_left=row, spad_stride=row,
                  pad_value=fill, pad_i16=pad16, label=label)  # fmt: skip
            i += run
        return
    r0, r1 = max(top, 0), min(bottom, g.h)
    pad_top, pad_bottom = r0 - top, bottom - r1
    if r1 <= r0:  # only padding
        pad_top, pad_bottom, r0, r1 = bottom - top, 0, 0, 0
    b.add(
        "load",
        spad=buf,
        dram=x.addr + ((n * g.h + r0) * width + col0) * cp,
        rows=r1 - r0,
        cols=g.w * cp if r1 > r0 else 0,
        spad_stride=g.wp * cp,
        dram_stride=width * cp,
        pad_top=pad_top,
        pad_bottom=pad_bottom,
        pad_left=g.pl * cp,
        pad_right=(g.wp - g.w - g.pl) * cp if r1 > r0 else g.wp * cp - g.pl * cp,
        pad_value=fill,
        pad_i16=pad16,
        label=label,
    )


@dataclass(frozen=True)
class SecondConv:
    """A second convolution of the same input and geometry, run band by band beside the first, whose
    requantised tile is the residual the output pass adds (`ResidualAdd` with no address): the two
    layers of int16 weights (compiler/wide_weights.py) read their input once and their sum never goes
    through DRAM. `weights` int8 as the first's, `bias` int64 (the input zero point folded in),
    `rq` the requantisation to its own output; its per-channel pairs are at column `col0` + c."""

    weights: np.ndarray
    bias: np.ndarray
    rq: dict
    col0: int = 0


@dataclass
class ConvTile:
    co0: int
    co_t: int
    win0: int  # first physical input channel of the tile's window
    chunks: list[tuple[int, int]]  # (offset in window, length) of each input-channel chunk
    w_addr: list[int]  # DRAM address of each chunk's weight block
    # per chunk, the tile's output columns [lo, hi) its input channels reach (a grouped convolution's
    # chunk feeds its groups' columns only); (0, 0): none, the chunk's MATMULs are left out
    cols: list[tuple[int, int]]
    wlen: int  # input channels of the window
    # per chunk: None, or its MATMULs one A word of int16 channels each (`narrow_subs`): (first
    # channel of the chunk, first output column, columns) - the chunk's weights rearranged to match
    subs: list[list[tuple[int, int, int]] | None] = field(default_factory=list)
    # per chunk: the channels [0, k) of it that some output reads - its MATMULs' k (past them the
    # pitch's padding channels, zero weights: steps that add nothing)
    k: list[int] = field(default_factory=list)
    # the channels a tap takes in the rows of one weight block shared by every chunk (`_packs`), loaded
    # once for the tile; 0: a block a chunk, loaded per band where the tile has several
    packed: int = 0

    def base(self, windowed: bool) -> int:
        """Element offset of the window's first channel in a band pixel."""
        return 0 if windowed else self.win0


@dataclass
class ConvPlan:
    co_t: int
    ci_t: int
    rows: int
    band_mode: bool
    est_cycles: int
    spad_bytes: int
    cols: int = 0  # output columns per strip (width splitting; 0: the whole width)
    bias_mm: bool = False  # the accumulators start as the bias by a MATMUL (compiler/bias.py), not a LOAD
    pixels: BandPixels | None = None  # how the band holds its pixels on chip

    def m(self, g: Geometry) -> int:
        """MATMUL rows of a full band (`g`: the planned strip's geometry)."""
        return _conv_m(g, self.rows, self.band_mode, self.pixels)

    def bands(self, g: Geometry, cout_p: int) -> int:
        """The bands the plan runs (output tiles x frames x row bands x strips)."""
        strips = cdiv(g.ow, self.cols) if self.cols else 1
        return cdiv(cout_p, self.co_t) * g.n * cdiv(g.oh, self.rows) * strips

    def describe(self, g: Geometry, cout_p: int, cin_win: int) -> str:
        parts = []
        if g.n > 1:
            parts.append(f"frame x{g.n}")
        if self.co_t < cout_p:
            parts.append(f"out-channel x{cdiv(cout_p, self.co_t)}")
        if self.pixels is not None and self.pixels.planes > 1:
            s = self.pixels.planes
            parts.append(f"band rows and columns in {s} x {s} phases" if self.pixels.phased
                         else f"band columns in {s} planes")  # fmt: skip
        if self.ci_t < cin_win:
            parts.append(f"in-channel x{cdiv(cin_win, self.ci_t)}")
        if self.rows < g.oh:
            parts.append(f"height x{cdiv(g.oh, self.rows)} (halo {max(g.ekh - g.sh, 0)})")
        if self.cols:
            parts.append(f"width x{cdiv(g.ow, self.cols)} (halo {max(g.ekw - g.sw, 0)})")
        return ", ".join(parts) or "none"


def _weight_bytes(cfg: NpuConfig, co_t: int, row: int, pair: bool = False) -> int:
    """A tile's weight block on chip (`co_t` rows of `row` bytes); with `pair` (`SecondConv`) the
    second's block after it, from the next lane word."""
    w = co_t * bank_stride(cfg, row, cfg.lanes)
    return 2 * round_up(w, cfg.lanes) if pair else w


def _weight_dma(
    sets: int, n_co: int, n_ci: int, taps: int, co_t: int, win: int, ci_t: int, bands: int, packed: bool
) -> tuple[int, int, int]:
    """(bytes, DMA rows, LOADs a band) of a convolution's weights: a tile's block once, where the tile
    has one chunk of its `win` channels or its chunks share one block of `ci_t` channels a tap
    (`packed`); else every chunk's block each band."""
    if packed:
        return sets * n_co * taps * ci_t * co_t, sets * n_co * co_t, 1
    again = bands if n_ci > 1 else 1
    return sets * n_co * taps * win * co_t * again, sets * n_co * n_ci * co_t * again, n_ci


def _tile_reads(chanx: np.ndarray, cout: int, groups: int, cin_g: int, co0: int, co_t: int, win0: int,
                wlen: int) -> np.ndarray:  # fmt: skip
    """(co_t x wlen) which of a tile's window channels each of its output columns reads (by the
    groups, not the weights' values)."""
    cout_g = cout // groups
    reads = np.zeros((co_t, wlen), bool)
    for co in range(co0, min(co0 + co_t, cout)):
        gi = co // cout_g
        reads[co - co0, chanx[gi * cin_g : (gi + 1) * cin_g] - win0] = True
    return reads


def _reach(reads: np.ndarray, pes: int) -> tuple[int, int]:
    """The output columns [lo, hi) a chunk feeds (`reads`: the tile's columns x the chunk's channels),
    from an accumulator row boundary (C's columns start there); (0, 0): none."""
    used = np.flatnonzero(reads.any(axis=1))
    if not len(used):
        return 0, 0
    return int(used[0]) // pes * pes, min(reads.shape[0], round_up(int(used[-1]) + 1, pes))


def _packs(reach: list[tuple[int, int]]) -> bool:
    """Whether a tile's chunks can share one weight block: no output column is fed by two of them,
    so row c of the block holds the weights of column c's chunk only (a grouped convolution's chunks
    each feed their groups' columns; a depthwise one's weights are then the tile's, not a dense
    block a chunk of mostly zeros, and stay on chip over the bands)."""
    spans = sorted(r for r in reach if r[1] > r[0])
    return len(reach) > 1 and all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def _packer(cfg: NpuConfig, chanx: np.ndarray, weights: np.ndarray, groups: int, cpy: int, window):
    """`plan_conv`'s `packs` for a grouped convolution (None for one group): whether every output
    tile of co_t channels packs its chunks of ci_t (`_packs`)."""
    if groups == 1:
        return None
    cout, cin_g = weights.shape[:2]
    pes = cfg.pes_per_cluster

    @functools.cache
    def packs(co_t: int, ci_t: int) -> bool:
        for co0 in range(0, cpy, co_t):
            ct = min(co_t, cpy - co0)
            win0, wlen = window(co0, ct)
            reads = _tile_reads(chanx, cout, groups, cin_g, co0, ct, win0, wlen)
            if not _packs([_reach(reads[:, c : c + ci_t], pes) for c in range(0, wlen, ci_t)]):
                return False
        return True

    return packs


def _narrow_width(cfg: NpuConfig) -> int:
    """int16 channels in one A word (lanes / 2) when MATMULs that narrow keep C's columns at
    accumulator-row boundaries (a multiple of pes_per_cluster), else 0."""
    if cfg.a16_full_rate:  # an int16 step takes lanes channels, as int8: nothing to narrow
        return 0
    s = cfg.lanes // 2
    return s if s and s % cfg.pes_per_cluster == 0 else 0


def _chunk_steps(cfg: NpuConfig, m: int, n_mm: int, ci_t: int, ex: int, narrow: bool) -> tuple[int, int]:
    """(matrix steps, MATMULs) of one chunk's tap: one MATMUL over `n_mm` columns and `ci_t`
    channels, or with `narrow` one a word of int16 channels (each over its own columns)."""
    s = _narrow_width(cfg)
    if narrow and ex == 2 and s and ci_t % s == 0 and ci_t > s:
        return cdiv(m, cfg.clusters) * (ci_t // s) * cdiv(s, cfg.pes_per_cluster), ci_t // s
    k_bytes = a_step_bytes(cfg, ex) * ci_t
    return cdiv(m, cfg.clusters) * cdiv(n_mm, cfg.pes_per_cluster) * cdiv(k_bytes, cfg.lanes), 1


def narrow_subs(
    cfg: NpuConfig, reads: np.ndarray, dense: np.ndarray, ex: int
) -> list[tuple[int, int, int]] | None:
    """A depthwise chunk of int16 input as MATMULs of one A word (s = lanes / 2 channels) each: an
    int16 MATMUL takes twice the k steps of int8, and over a whole chunk each k step feeds only the
    columns of its own channels, so half the steps multiply zeros; one MATMUL a word spans only its
    columns. `reads` (columns x chunk channels): which channels each output column reads; possible
    when each word's columns are one aligned block of at most s that reads nothing else. Then
    `dense` (columns x kh x kw x chunk channels, the chunk's weights) is rearranged in place: each
    column's weights move to the first s channels, where its MATMUL reads them. Returns (first
    channel, first column, columns) per MATMUL, or None (one MATMUL for the chunk)."""
    s, pes = _narrow_width(cfg), cfg.pes_per_cluster
    cl = reads.shape[1]
    if ex != 2 or not s or cl % s or cl <= s:
        return None
    subs, moved = [], np.zeros_like(dense)
    for c in range(0, cl, s):
        cols = np.flatnonzero(reads[:, c : c + s].any(axis=1))
        if not len(cols):
            continue
        lo = int(cols[0]) // pes * pes
        hi = round_up(int(cols[-1]) + 1, pes)
        if hi - lo > s or reads[cols][:, :c].any() or reads[cols][:, c + s :].any():
            return None
        moved[cols, ..., :s] = dense[cols, ..., c : c + s]
        subs.append((c, lo, min(hi, reads.shape[0]) - lo))
    dense[...] = moved
    return subs


def _conv_m(g: Geometry, rows: int, band_mode: bool, px: BandPixels | None = None) -> int:
    """A band's MATMUL rows: in band mode its output rows `wv` A rows apart (`BandPixels.wv`)."""
    wv = px.wv(g, band_mode) if px is not None else g.wp
    return (rows - 1) * wv + g.ow if band_mode else rows * g.ow


def plan_conv(
    cfg: NpuConfig,
    g: Geometry,
    cpx: int,
    cout_p: int,
    win_of: Callable[[int], int],
    co_step: int,
    where: str,
    max_step: int = 0,
    max_live: int = 0,
    ex: int = 1,
    ey: int = 1,
    cols_of: Callable[[int, int], int] | None = None,
    post: OutputPass | None = None,
    narrow: bool = False,
    bias_k: int = 0,
    whole_width: bool = True,
    gather: Callable[[int, int], tuple[int, int, int]] | None = None,
    pair: bool = False,
    packs: Callable[[int, int], bool] | None = None,
    depthwise: bool = False,
) -> ConvPlan:
    """Pick output/input channel tile sizes and the row band height with the cost model.
    `win_of(co_t)`: the input channels a tile of co_t output channels reads: all of them, or for a
    grouped convolution the widest window of its groups; a window narrower than the tensor is all
    the band holds of a pixel (`windowed`). `cols_of(co_t, ci_t)`: the output columns a chunk of
    ci_t input channels reaches (a grouped convolution's MATMULs are that narrow). `ex`, `ey`: the
    input's and the output's element bytes (int16: 2; the output's int8 or int16 tile on chip).
    `post`: a function computed on each output tile (its scratch, table and vector passes).
    `narrow`: a depthwise convolution of int16 input whose chunks run as MATMULs of one A word each
    where they can (`narrow_subs`): timed so. `bias_k`: the bias's digits (compiler/bias.py; 0: it
    can only be a LOAD): each tiling takes the bias as a MATMUL where its block fits and it takes at
    most half the LOAD's cycles, else a LOAD, and is timed so. `whole_width`: `g` is the whole
    output width (not a strip), so that one band for every output tile is loaded once. `gather`: the
    band is gathered (compiler/im2col.py): (LOADs, bus words, DMA rows) of a band of (rows, columns).
    `pair`: a second convolution of the same input runs beside it (`SecondConv`): twice the weights,
    the MATMULs and the bias, a third accumulator tile, a VMAP more, no LOAD of the residual's tile.
    `packs(co_t, ci_t)`: a tile's chunks share one weight block (`_packs`); `depthwise`: see `_tilings`."""
    ca, sets = channel_align(cfg), 2 if pair else 1
    full = cpx
    cpx *= ex  # bytes of an input pixel from here on
    if g.wp * cpx > 0xFFFF:
        raise CompileError(f"{where}: an input row of {g.wp} x {cpx} bytes exceeds one DMA row (65535)")
    band_mode = g.sh == 1 and g.sw == 1
    post_elem, post_steps = (post.scratch, post.steps) if post else (0, 0)  # an output element's scratch
    post_fixed = LUT_BYTES + cfg.lanes if post and post.table is not None else 0
    residual = post is not None and post.residual is not None and not pair  # its tile: a LOAD a band
    # the bias block's bytes among the activations, and its digits' among the weights: a banked
    # scratchpad keeps the digits in the weights' half, so the A row and they are read from other banks
    digit_bytes = sets * cout_p * biasmm.row_pitch(cfg.lanes) if bias_k else 0
    bias_block = biasmm.a_bytes(cfg.lanes) + (0 if cfg.spad_banked else digit_bytes) if bias_k else 0
    best = None
    co_opts = sorted({min(cout_p, co_step * (1 << j)) for j in range(16)} | {cout_p})
    taps = g.kh * g.kw
    for co_t, bp in _tilings(cfg, g, co_opts, win_of, ex, band_mode, gather is not None, full, depthwise):
        n_co = cdiv(cout_p, co_t)
        win = win_of(co_t)
        windowed = win < full  # the band: the whole pixel unless windowed
        # the cycles a step takes for the clusters' A reads; a MATMUL a tap for the whole band
        share, bm = a_sharing(cfg, bp.pitch, ex, bp.stride), band_mode or bp.phased
        ci_opts = sorted({max(ca, round_up(cdiv(win, d), ca)) for d in (1, 2, 3, 4, 6, 8, 16, 32, 64, 128)})
        for ci_t in ci_opts:
            n_ci = cdiv(win, ci_t)
            n_mm = co_t if cols_of is None else cols_of(co_t, ci_t)  # a MATMUL's output columns
            wbytes = _weight_bytes(cfg, co_t, taps * ci_t, pair)
            packed = n_ci > 1 and packs is not None and packs(co_t, ci_t)
            wbufs = 1 if (n_ci == 1 or packed) and n_co == 1 else 2
            act_bytes, w_base = spad_regions(cfg)
            w_left = cfg.spad_bytes - w_base - wbufs * round_up(wbytes, cfg.lanes)  # banked: digits' room
            if cfg.spad_banked:
                room = act_bytes if w_left >= 0 else -1
            else:
                room = cfg.spad_bytes - wbufs * wbytes
            room -= post_fixed
            def fits(r: int, tiling=(n_ci, n_mm, ci_t, co_t, room, share, bp, bm)) -> bool:
                n_ci, n_mm, ci_t, co_t, room, share, bp, bm = tiling
                m = _conv_m(g, r, bm, bp)
                steps = _chunk_steps(cfg, m, n_mm, ci_t, ex, narrow)[0] * share
                band_t = sets * n_ci * taps * (cfg.matrix_latency + steps)
                return (
                    2 * (bp.bytes(g, r, ex) + m * co_t * ey) + m * co_t * post_elem <= room
                    and (1 + sets) * m * acc_row_stride(cfg, co_t) <= cfg.acc_bytes
                    and m <= 0xFFFF
                    # with a cancellation interval, one band must not take longer than it
                    and (not max_step or r == 1 or band_t <= max_step)
                )

            rows = _tallest_band(g.oh, fits)
            if rows == 0:
                continue
            bands = cdiv(g.oh, rows) * g.n
            m = _conv_m(g, rows, bm, bp)
            steps, per_chunk = _chunk_steps(cfg, m, n_mm, ci_t, ex, narrow)
            steps *= share
            mm_per_band = sets * n_ci * taps * (1 if bm else rows) * per_chunk
            matrix = n_co * bands * (mm_per_band * cfg.matrix_latency + sets * n_ci * taps * steps)
            w_bytes, w_rows, w_loads = _weight_dma(sets, n_co, n_ci, taps, co_t, win, ci_t, bands, packed)
            band_loads, in_beats, band_rows = _band_dma(
                cfg, g, rows, bands, n_co, (bp, ex, win), windowed, whole_width, max_step, max_live, gather
            )
            loads = w_loads + band_loads
            load = dram_cycles(cfg, in_beats + w_bytes // cfg.bus_bytes, band_rows + w_rows)
            load += n_co * bands * loads * cfg.dma_latency
            out_beats = n_co * bands * m * co_t * ey // cfg.bus_bytes
            out_rows = n_co * bands * (rows if co_t == cout_p else m)
            load += n_co * bands * cfg.dma_latency + dram_cycles(cfg, out_beats, out_rows) if residual else 0
            if cfg.dram_word_bytes:  # one DRAM for the loads, the stores and the instructions' fetch
                instrs = n_co * bands * (loads + mm_per_band + 3 + (1 if residual else 0))
                stores = dram_cycles(cfg, out_beats, out_rows, write=True)
                load += stores + instrs * INSTR_BYTES // cfg.dram_word_bytes
            vector = n_co * bands * m * cdiv(co_t, cfg.vector_lanes) * (sets + post_steps)  # a VMAP a set
            # the bias: a LOAD of m rows of the tile's int32 per band, or a MATMUL of one k step
            bias_load = sets * n_co * bands * _bias_load_cycles(cfg, m, co_t)
            bias_mm_cycles = sets * n_co * bands * _bias_matmul_cycles(cfg, m, co_t, bias_k)
            band_bytes = 2 * (bp.bytes(g, rows, ex) + m * co_t * ey) + m * co_t * post_elem
            # the bias as a MATMUL where its block fits and it takes at most half the LOAD's
            # cycles (not where the array reads int16 at half rate with clusters sharing a bank
            # word, or on `tiny`'s narrow array): a bias LOAD waits for the output pass of the band
            # two before (their accumulator buffer) on the in-order load unit, holding up the loads
            # behind it, and the band's MATMULs wait for it - a chain this estimate (the busiest
            # unit) does not see, so it is not asked (docs/compiler.md, "The bias")
            bias_mm = bool(bias_k) and band_bytes + bias_block <= room and 2 * bias_mm_cycles <= bias_load
            bias_mm = bias_mm and (not cfg.spad_banked or digit_bytes <= w_left)
            if bias_mm:
                est = max(matrix + bias_mm_cycles, load, vector)
            else:
                est = max(matrix, load + bias_load, vector)
            band = sets * n_ci * taps * (cfg.matrix_latency + steps)
            # between bands the weights stay on chip: too many of them and no point can go there
            live_blocked = bool(max_step) and bands > g.n and (n_ci == 1 or packed) and wbytes > max_live
            key = (bool(max_step) and band > max_step, live_blocked, est, n_co * n_ci)
            if best is None or key < best[0]:
                spad = wbufs * wbytes + band_bytes + post_fixed + (bias_block if bias_mm else 0)
                plan = ConvPlan(co_t, ci_t, rows, bm, est, spad, bias_mm=bias_mm, pixels=bp.sized(g, rows))
                best = (key, plan)
    if best is None:
        # what the smallest tiling (one output row, the narrowest channel tiles) would need
        co_t = co_opts[0]
        win = win_of(co_t)
        ci_t = max(ca, round_up(cdiv(win, 128), ca))
        m = _conv_m(g, 1, band_mode)
        w = co_t * bank_stride(cfg, taps * ci_t, cfg.lanes) * (1 if co_t >= cout_p and ci_t >= win else 2)
        spad = w + 2 * (g.in_rows(1) * g.wp * cpx + m * co_t * ey) + m * co_t * post_elem + post_fixed
        raise CompileError(
            f"{where}: no tiling fits {memory_name(cfg)} and {memory_name(cfg, acc=True)}: the smallest "
            f"(one output row of {g.ow} pixels, {co_t} output and {ci_t} input channels, an input band of "
            f"{g.in_rows(1)} rows x {g.wp} x {cpx} bytes) needs {spad} scratchpad and "
            f"{2 * m * acc_row_stride(cfg, co_t)} accumulator bytes"
        )
    return best[1]


def _tilings(cfg: NpuConfig, g: Geometry, co_opts: list[int], win_of, ex: int, band_mode: bool, gather: bool,
             full: int, depthwise: bool = False) -> list[tuple[int, BandPixels]]:  # fmt: skip
    """(output channel tile, how its band holds its pixels) a planner tries: at the tensor's pitch
    and at `a_pitch`'s, and a strided convolution's with its columns in planes where that separates
    the clusters' banks (`a_planes`); the cheaper by the estimate. A band loaded a DMA row an input
    row (neither gathered nor a window of the tensor's `full` channels) loads a DMA row a pixel
    at another pitch or in planes, so plain is tried too; the others take the pitch. A strided
    `depthwise` convolution's band is tried with its rows in phases too (`BandPixels.phased`: a
    MATMUL a tap, not a tap and output row; not tried for dense ones, where the estimate ranked it
    wrongly: docs/compiler.md, "Strided bands in phases")."""
    out = []
    for c in co_opts:
        win = win_of(c)
        per_pixel = gather or win < full
        planes = {1} if band_mode or gather else {1, a_planes(cfg, win, ex, g.sw)}
        pads = {(p, pad) for p in planes for pad in (True, per_pixel or p > 1)}
        opts = {BandPixels.of(cfg, g, win, ex, p, band_mode, pad) for p, pad in pads}
        if depthwise and phases(g) and not gather:  # rows in phases too: a MATMUL a tap (`BandPixels.phased`)
            opts.add(BandPixels(a_pitch(cfg, win, ex), g.sh, phased=True))
        out += [(c, bp) for bp in sorted(opts, key=lambda bp: (bp.planes, bp.pitch))]
    return out


def phases(g: Geometry) -> bool:
    """Whether a band of this convolution can keep its rows and columns in phases by the stride
    (`BandPixels.phased`): the same stride both ways, no dilation, every phase read by a tap."""
    return 1 < g.sh == g.sw <= min(g.kh, g.kw) and g.dh == g.dw == 1


def _tallest_band(oh: int, fits: Callable[[int], bool]) -> int:
    """Output rows of the tallest band that `fits` (its sizes grow with the rows); 0 when not one
    row fits. (Bands of even heights instead, or where the last band would be under half a band,
    were measured and not kept: docs/compiler.md, "Band heights".)"""
    rows, lo, hi = 0, 1, oh
    while lo <= hi:
        r = (lo + hi) // 2
        if fits(r):
            rows, lo = r, r + 1
        else:
            hi = r - 1
    return rows


def fold_pays(
    cfg: NpuConfig, x: Act, x_fold: Act, cpy: int, ey: int, g: Geometry, where: str, max_step: int = 0,
    max_live: int = 0,
) -> bool:  # fmt: skip
    """Whether a convolution of one group (`g`, `cpy` output elements a pixel of `ey` bytes) is
    cheaper by the cost model with its taps folded (compiler/im2col.py) over input `x_fold` than as a
    MATMUL per tap over `x` (the same tensor; `x_fold` may be laid out without channel padding)."""
    ca = channel_align(cfg)

    def est(xa: Act, ga: Geometry, gather) -> int:
        cp = xa.layout.cp
        return plan_conv_strips(ga, lambda geo: plan_conv(
            cfg, geo, cp, cpy, lambda co_t: cp, ca, where, max_step, max_live, xa.layout.elem, ey,
            whole_width=geo.ow == ga.ow, gather=gather,
        ))[0].est_cycles  # fmt: skip

    fx, fg = im2col.folded_input(cfg, ca, x_fold, g)
    try:
        folded = est(fx, fg, _gather_cost(cfg, x_fold, g))
    except CompileError:
        return False
    try:
        return folded < est(x, g, None)
    except CompileError:
        return True


def _band_dma(
    cfg: NpuConfig, g: Geometry, rows: int, bands: int, n_co: int, px: tuple[BandPixels, int, int],
    windowed: bool, whole_width: bool, max_step: int, max_live: int, gather,
) -> tuple[int, int, int]:  # fmt: skip
    """(LOADs a band, bus words and DMA rows in all) of a convolution's input bands of `rows` output
    rows (`px`: how the band holds its pixels, their element bytes, the elements of a pixel's data):
    a windowed band is a LOAD an input row (a plane), a DMA row a pixel, as is one whose pitch on
    chip is wider than its data or whose rows are in planes; a gathered one (`gather`,
    compiler/im2col.py) its own; else a LOAD a band, a DMA row an input row, loaded once for all
    output tiles where one band holds the input (`keeps_one_band`)."""
    bp, ex, data = px
    in_bytes = bp.bytes(g, rows, ex)
    one = keeps_one_band(whole_width, windowed, bands, n_co, in_bytes, max_step, max_live)
    reloads = 1 if one else n_co
    if windowed or bp.pitch > data or bp.planes > 1:
        dma_rows = reloads * bands * g.in_rows(rows) * g.w  # a pixel each
        return 1 + g.in_rows(rows) * bp.planes, dma_rows * cdiv(data * ex, cfg.bus_bytes), dma_rows
    if gather is not None:
        loads, beats, dma_rows = gather(rows, g.ow)
        return loads, reloads * bands * beats, reloads * bands * dma_rows
    return 1, reloads * bands * in_bytes // cfg.bus_bytes, reloads * bands * g.in_rows(rows)


def _gather_cost(cfg: NpuConfig, x: Act, g: Geometry) -> Callable[[int, int], tuple[int, int, int]]:
    """`plan_conv`'s `gather`: (LOADs, bus words, DMA rows) of a folded band of (rows, columns)."""

    def cost(rows: int, cols: int) -> tuple[int, int, int]:
        loads, dma_rows = im2col.gather_loads(x, g, rows, 0, cols)
        return loads, dma_rows * im2col.gather_beats(cfg, x, g), dma_rows

    return cost


def keeps_one_band(
    whole_width: bool, windowed: bool, bands: int, tiles: int, band_bytes: int, max_step: int, max_live: int
) -> bool:
    """Whether a convolution loads its input once for all its output tiles: one band of every
    channel over the whole width (`bands` counts frames too), several tiles - and, as the band is
    live at the cancellation points between tiles, with points (`max_step`) only when a point there
    keeps within the live data wanted (`max_live`)."""
    one = whole_width and not windowed and bands == 1 and tiles > 1
    return one and (not max_step or band_bytes <= max_live)


def plan_conv_strips(g: Geometry, plan_for: Callable[[Geometry], ConvPlan]) -> tuple[ConvPlan, Geometry]:
    """`plan_for` (a `plan_conv`) over the whole width, else over strips of the output width (halo
    `kw - sw` input columns shared by neighbours), the widest that fits; returns the plan and the
    geometry it was made for (the widest strip)."""
    try:
        return plan_for(g), g
    except CompileError as e:
        error = e
    widths, parts = set(), 2
    while parts < g.ow:
        widths.add(cdiv(g.ow, parts))
        parts = parts + 1 if parts < 8 else parts * 3 // 2
    for cols in sorted(widths | {1}, reverse=True):  # the widest strips first, one column last
        gs = g.widest_strip(cols)
        try:
            plan = plan_for(gs)
        except CompileError as e:
            error = e
        else:
            strips = cdiv(g.ow, cols)
            plan.cols, plan.est_cycles = cols, plan.est_cycles * strips
            return plan, gs
    raise CompileError(f"{error} (also split into strips of the width, down to one output column)")


def conv_program(
    b: ProgramBuilder,
    cfg: NpuConfig,
    x: Act,
    y: Act,
    weights: np.ndarray,
    bias: np.ndarray,
    groups: int,
    g: Geometry,
    rq: dict,
    const: Callable[[bytes, str], int],
    where: str,
    max_step: int = 0,
    max_live: int = 0,
    post: OutputPass | None = None,
    narrow: bool = True,
    fold: str = "auto",
    second: SecondConv | None = None,
    dry: bool = False,
    planned: tuple[ConvPlan, Geometry] | None = None,
    then: tuple[pointwise.Pointwise, pointwise.Places] | None = None,
) -> dict:
    """Emit a convolution. `weights` int8 (Cout, Cin/groups, kh, kw); `bias` int64 (Cout), the input
    zero point already folded in; `rq` the requantisation fields of the VMAP (mult, shift, zp_out,
    lo, hi; mult and shift may be per output channel, see `add_requant`), or None: `y` holds the
    int32 accumulators (4-byte elements, stored from the accumulator memory as they are). `post`:
    a function of the requantised output computed on each band before it is stored (`y` is then
    that function's output, of the same element type). `narrow`: a depthwise convolution of int16
    input takes a MATMUL per A word (`narrow_subs`). A strided convolution of few input channels
    runs with its taps folded into k (compiler/im2col.py) by `fold`: auto (where the cost model finds
    it cheaper), on or off - or where its input has no channel padding, always. `second`: a second
    convolution of the input whose result `post`'s residual Add takes (`SecondConv`). Returns the plan
    for the compile report (`dry`: only plans, emits and allocates nothing, and returns the plan as
    "planned", which a later call with the same arguments takes instead of planning again; a
    CompileError when no tiling fits). `then`: a 1 x 1 convolution on each band (compiler/pointwise.py)."""
    ca = channel_align(cfg)
    # src: the convolution's own input and geometry, where its bands are gathered (im2col)
    src, x, g, weights = _fold_choice(cfg, x, y, rq, g, weights, groups, where, max_step, max_live, fold)
    if second is not None and src is not None:  # its weights folded as the first's
        second = replace(second, weights=im2col.folded_weights(*src, second.weights))
    cout, cin_g = weights.shape[:2]
    cpx, cpy = x.layout.cp, y.layout.cp
    ex = x.layout.elem  # int16 input: 2 bytes an element (A of the MATMULs)
    ey = 1 if rq is None else y.layout.elem  # the requantised output's element bytes
    chanx = np.asarray(x.layout.chan)
    cout_g = cout // groups
    co_step = ca if groups == 1 else (round_up(cout_g, ca) if cout_g % ca == 0 else ca)
    co_step = co_step if then is None else cpy  # the 1 x 1 layer after it reads every channel of a band

    def window(co0: int, co_t: int) -> tuple[int, int]:
        real = range(co0, min(co0 + co_t, cout))
        groups_used = {co // cout_g for co in real}
        if not groups_used:  # a tile of the output's pitch padding only: zero weights, any window
            return 0, min(ca, cpx)
        phys = np.concatenate([chanx[gi * cin_g : (gi + 1) * cin_g] for gi in sorted(groups_used)])
        lo, hi = int(phys.min()) // ca * ca, round_up(int(phys.max()) + 1, ca)
        return lo, hi - lo

    def win_of(co_t: int) -> int:
        return max(window(c0, co_t)[1] for c0 in range(0, cout, co_t)) if groups > 1 else cpx

    def cols_of(co_t: int, ci_t: int) -> int:
        if groups == 1:
            return co_t
        # groups a chunk of ci_t channels spans (aligned when cin_g divides it), their columns
        spans = ci_t // cin_g if ci_t % cin_g == 0 else cdiv(ci_t, cin_g) + 1
        return min(co_t, round_up(spans * cout_g, cfg.pes_per_cluster))

    bias_p, bias2_p = np.zeros((2, cpy), np.int64)  # the second's: zeros when there is none
    bias_p[:cout], bias2_p[:cout] = bias, 0 if second is None else second.bias
    # one bias block for both convolutions: the second's channels after the first's
    digits = biasmm.digits(bias_p if second is None else np.concatenate([bias_p, bias2_p]))

    packs, dw = _packer(cfg, chanx, weights, groups, cpy, window), groups > 1 and cin_g == 1 == cout_g

    def plan_for(geo: Geometry) -> ConvPlan:
        return plan_conv(
            cfg, geo, cpx, cpy, win_of, co_step, where, max_step, max_live, ex, ey, cols_of, post,
            narrow=narrow and dw, depthwise=dw,
            bias_k=0 if digits is None else digits.shape[1], whole_width=geo.ow == g.ow,
            gather=None if src is None else _gather_cost(cfg, *src), pair=second is not None, packs=packs,
        )  # fmt: skip

    plan, gp = planned or plan_conv_strips(g, plan_for)
    if dry:
        return {"planned": (plan, gp)}
    band_px = win_of(plan.co_t)  # elements of a band's pixel: the widest tile window (else cpx)
    windowed = band_px < cpx  # the bands hold a tile's window of channels only
    bp = plan.pixels or BandPixels(band_px)  # how a band holds its pixels on chip
    strips = [(g, 0, 0)]  # (geometry, first input column, first output column) of each strip
    if plan.cols:
        strips = [g.strip(x0, min(plan.cols, g.ow - x0)) + (x0,) for x0 in range(0, g.ow, plan.cols)]
    taps = g.kh * g.kw
    tiles = _conv_tiles(cfg, plan, x, y, weights, groups, g, window, const, where, ex if narrow else 1)
    # the second's: the same tiles, chunks and MATMULs over its weights
    tiles2 = [None] * len(tiles) if second is None else _conv_tiles(
        cfg, plan, x, y, second.weights, groups, g, window, const, where, ex if narrow else 1)  # fmt: skip
    block = biasmm.block(digits, cfg.lanes) if plan.bias_mm else b""
    bias_addr = None if block else const(bias_p.astype("<i4").tobytes(), f"{where} bias")
    bias2_addr = None if block or second is None else const(bias2_p.astype("<i4").tobytes(), f"{where} bias")
    w_bufs, in_bufs, out_bufs, acc_bufs, extra = _conv_buffers(
        cfg, plan, gp, tiles, taps, bp, ex, ey, post, len(block), pair=second is not None
    )
    w2 = round_up(_weight_bytes(cfg, plan.co_t, taps * plan.ci_t), cfg.lanes)  # the second's block
    if block:  # the bias's A row and digits, resident for the operator
        _load_bias_block(b, cfg, const(block, f"{where} bias digits"), len(block), extra[2], extra[4])
    if post is not None and post.table is not None:  # the function's table, resident for the operator
        b.add("load", spad=extra[0], dram=post.table, rows=1, cols=LUT_BYTES, spad_stride=LUT_BYTES,
              dram_stride=LUT_BYTES, label="table")  # fmt: skip
    out_pass = (post, *extra[:2], y.layout.chan) if post else then and pointwise.resident(b, cfg, *then, cpy,
                                                                                           const)  # fmt: skip

    bm = plan.band_mode
    k = nw = wb = 0
    # one band for every output tile (the whole input, all channels): it is loaded once and read
    # by each tile's MATMULs, instead of again per tile
    one_band = keeps_one_band(len(strips) == 1, windowed, cdiv(g.oh, plan.rows) * g.n, len(tiles),
                              bp.bytes(gp, plan.rows, ex), max_step, max_live)
    bias_src = (extra[2], digits.shape[1], extra[4]) if block else bias_addr
    # what each band's MATMULs share; the second's bias: after the first's in the block, or its own row
    mm = SimpleNamespace(cfg=cfg, g=g, bm=plan.band_mode, taps=taps, w_bufs=w_bufs, w2=w2, ex=ex, ey=ey,
                         bp=bp, cpy=cpy, windowed=windowed, post=post, res_bufs=extra[3], second=second,
                         bias=bias_src, bias2=(bias_src, cpy) if block else (bias2_addr, 0))  # fmt: skip
    band_loaded = False
    for t, t2 in zip(tiles, tiles2, strict=True):
        c_stride = acc_row_stride(cfg, t.co_t)
        if len(t.chunks) == 1 or t.packed:  # the tile's weights: one block, on chip over its bands
            wb = w_bufs[nw % len(w_bufs)]
            nw += 1
            blocks = [(wb, t.w_addr[0])] + ([(wb + w2, t2.w_addr[0])] if t2 is not None else [])
            _weight_loads(b, cfg, blocks, t.co_t, taps * (t.packed or t.chunks[0][1]), f"weights co{t.co0}")
        for n, (gs, col0, x0) in itertools.product(range(g.n), strips):
            for y0 in range(0, g.oh, plan.rows):
                rows = min(plan.rows, g.oh - y0)
                m = _conv_m(gs, rows, bm, bp)
                ib, ob, ab = in_bufs[0 if one_band else k % 2], out_bufs[k % 2], acc_bufs[k % 2]
                ab2 = acc_bufs[2] if second is not None else None  # one: see _conv_buffers
                k += 1
                if windowed or not band_loaded:
                    band = (n, y0, rows, x0, col0)
                    _band_input(b, x, src, gs, t if windowed else None, band, ib, bp)
                    band_loaded = one_band and not windowed
                skip, wb, nw = _band_matmuls(b, mm, t, t2, (n, y0, x0, rows, m), gs, ib, (ab, ab2), k, wb, nw)
                _conv_output(b, y, rq, g, gs, t, bp.wv(gs, bm), n, y0, x0, rows, m, ab, ob, cpy, ey, c_stride,
                             out_pass, skip)  # fmt: skip
                b.candidate()  # between bands: the resident weights are live (and a band kept for all tiles)
    _ = isinstance(out_pass, pointwise.Fused) and out_pass.flush(b)
    folded = "" if src is None else f"; taps folded into k (im2col: {im2col.describe(*src)})"
    return {"split": plan.describe(g, cpy, win_of(plan.co_t)) + folded, "spad_bytes": plan.spad_bytes,
            "tile": {"co": plan.co_t, "ci": plan.ci_t, "rows": plan.rows}, "est_cycles": plan.est_cycles}


def _band_input(b, x: Act, src, gs: Geometry, t, band: tuple, ib: int, px: BandPixels) -> None:
    """A band's input into `ib`: the tile `t`'s window of channels (None: every channel), or gathered
    for a convolution whose taps fold into k (`src`). `band`: (frame, first output row, rows, first
    output column, first input column); `px`: how the band holds its pixels on chip."""
    n, y0, rows, x0, col0 = band
    fill, label = x.q.zero_point if x.layout.elem == 1 else 0, f"input n{n} y{y0} x{x0}"
    if t is not None:
        _load_band(b, x, gs, n, y0, rows, ib, fill, label, col0, t.win0, t.wlen, px)
    elif src is None:
        _load_band(b, x, gs, n, y0, rows, ib, fill, label, col0, px=px)
    else:
        im2col.gather_band(b, *src, n, y0, rows, x0, gs.ow, ib, px.pitch * x.layout.elem, fill, label)


def _weight_loads(b, cfg: NpuConfig, blocks: list[tuple[int, int]], rows: int, cols: int, label: str) -> None:
    """LOADs of weight blocks of `rows` x `cols` bytes, (scratchpad, DRAM) each."""
    for at, dram in blocks:
        b.add("load", spad=at, dram=dram, rows=rows, cols=cols, dram_stride=cols,
              spad_stride=bank_stride(cfg, cols, cfg.lanes), label=label)  # fmt: skip


def _band_matmuls(b, s: SimpleNamespace, t, t2, band: tuple, gs: Geometry, ib: int, accs: tuple, k: int,
                  wb: int, nw: int) -> tuple[int, int, int]:  # fmt: skip
    """A band's accumulators started as the bias, its chunks' weights (loaded per band when the tile
    has several) and MATMULs into accumulators `accs` (the first's, the second's), a residual's tile
    loaded or (`SecondConv`) the second's requantised into its place. `band`: (frame, first output
    row and column, rows, MATMUL rows). Returns (where the residual's tile is, 0: none; the weight
    buffer; the weight buffers used so far)."""
    n, y0, x0, rows, m = band
    cfg, g, second = s.cfg, s.g, s.second
    ab, ab2 = accs
    c_stride = acc_row_stride(cfg, t.co_t)
    if second is not None:
        _start_with_bias(b, cfg, t, m, ab2, c_stride, *s.bias2)
    _start_with_bias(b, cfg, t, m, ab, c_stride, s.bias)
    skip = _load_residual(b, s.post, s.res_bufs, k, g, gs, t, n, y0, x0, rows, s.bp.wv(gs, s.bm), s.cpy, s.ey)
    w2_addr = t2.w_addr if t2 is not None else [None] * len(t.chunks)
    chunks = zip(t.chunks, t.w_addr, w2_addr, t.cols, t.subs, t.k, strict=True)
    for (c0, cl), wa, wa2, reach, subs, kc in chunks:
        if reach[1] == reach[0]:
            continue  # input channels no output of the tile reads
        if len(t.chunks) > 1 and not t.packed:
            wb = s.w_bufs[nw % 2]
            nw += 1
            blocks = [(wb, wa)] + ([(wb + s.w2, wa2)] if wa2 is not None else [])
            _weight_loads(b, cfg, blocks, t.co_t, s.taps * cl, f"weights co{t.co0} ci{c0}")
        px = s.bp  # how the band holds its pixels
        # the second's first: its requantisation then runs under the first's MATMULs
        for wbuf, acc in ((wb + s.w2, ab2), (wb, ab)) if second is not None else ((wb, ab),):
            _chunk_matmuls(b, cfg, g, gs, t, s.bm, wbuf, c0, cl, kc, ib, acc, m, rows, px, s.ex, reach,
                           s.windowed, subs, t.packed or cl)  # fmt: skip
    if second is not None:  # its requantised tile: the residual the output pass adds
        add_requant(b, second.rq, t.co0 + second.col0, src=ab2, dst=skip, rows=m, cols=t.co_t,
                    src_stride=c_stride, dst_stride=t.co_t * s.ey)  # fmt: skip
    return skip, wb, nw


def _fold_choice(cfg, x: Act, y: Act, rq, g: Geometry, weights, groups: int, where: str, max_step: int,
                 max_live: int, fold: str):  # fmt: skip
    """(None, x, g, weights) as they are, or for a convolution whose taps are folded into k
    (compiler/im2col.py; `fold` auto, on or off) ((x, g), then the folded input, geometry and
    weights). An input without channel padding (not lane-aligned) always folds."""
    ca = channel_align(cfg)
    if im2col.folds(cfg, (g.kh, g.kw), (g.sh, g.sw), (g.dh, g.dw), groups, x.layout.cp, x.layout.elem):
        ey = 1 if rq is None else y.layout.elem
        if (x.layout.cp % ca or fold == "on") or (
            fold == "auto" and fold_pays(cfg, x, x, y.layout.cp, ey, g, where, max_step, max_live)
        ):
            return (x, g), *im2col.folded_input(cfg, ca, x, g), im2col.folded_weights(x, g, weights)
    return None, x, g, weights


def _load_bias_block(b, cfg: NpuConfig, dram: int, n: int, a_row: int, digits: int | None) -> None:
    """The bias block's LOAD (`n` bytes at `dram`) to `a_row`, or, where its digits are apart
    (`digits`: a banked scratchpad's weights' half), its A row's and its digits' LOADs."""
    a = biasmm.a_bytes(cfg.lanes)
    parts = [(a_row, 0, n)] if digits is None else [(a_row, 0, a), (digits, a, n - a)]
    for spad, off, cols in parts:
        b.add("load", spad=spad, dram=dram + off, rows=1, cols=cols, spad_stride=cols, dram_stride=cols,
              label="bias digits")  # fmt: skip


def _start_with_bias(b, cfg: NpuConfig, t, m: int, ab: int, c_stride: int, src, col0: int = 0) -> None:
    """A band's accumulators start as the tile's bias: `src` is (the bias block on chip, its digits'
    count, where they are when apart from its A row) for the MATMUL of its A row (every pixel's) by
    the tile's channels' digits (compiler/bias.py), or the bias's DRAM address for the LOAD of its
    row for every pixel. `col0`: the tile's first channel's place in the bias, past `t.co0`."""
    if isinstance(src, tuple):
        block, k, digits = src
        b.add("matmul", **bias_matmul(cfg, block, k, t.co0 + col0, ab, m, t.co_t, c_stride, digits))
    else:
        b.add("load", spad=ab, dram=src + 4 * (t.co0 + col0), rows=m, cols=4 * t.co_t, spad_stride=c_stride,
              dram_stride=0, label="bias")  # fmt: skip


def _chunk_matmuls(
    b, cfg, g, gs, t, bm, wb, c0, cl, k, ib, ab, m, rows, px, ex, reach, windowed, subs, w_row
) -> None:  # fmt: skip
    """One input chunk's MATMULs (`cl` its channels, `w_row` a tap's in its weight rows): over its
    first `k`, those some output reads, or (`subs`, see `narrow_subs`) one A word of channels each,
    that word's weights first in the chunk's row."""
    if subs is None:
        _conv_matmuls(b, cfg, g, gs, t, bm, wb, c0, k, ib, ab, m, rows, px, ex, reach, windowed, w_row=w_row)
        return
    for sc, lo, width in subs:
        _conv_matmuls(b, cfg, g, gs, t, bm, wb, c0 + sc, _narrow_width(cfg), ib, ab, m, rows, px, ex,
                      (lo, lo + width), windowed, w_row=w_row)  # fmt: skip


def _conv_tiles(
    cfg, plan, x: Act, y: Act, weights, groups: int, g: Geometry, window, const, where: str, ex: int = 1
):
    """The weight blocks of each output tile in DRAM: per input chunk, [co_t][kh][kw][chunk], zero
    where an output channel has no connection (grouped convolutions), or where no output column is
    fed by two chunks one block for all of them (`_packs`), each column's row from its chunk's; a
    depthwise chunk of int16 input rearranged for its MATMULs of one A word each (`narrow_subs`)."""
    cout, cin_g = weights.shape[:2]
    cout_g = cout // groups
    cpx, cpy = x.layout.cp, y.layout.cp
    chanx = np.asarray(x.layout.chan)
    tiles: list[ConvTile] = []
    for co0 in range(0, cpy, plan.co_t):
        co_t = min(plan.co_t, cpy - co0)
        win0, wlen = window(co0, co_t) if groups > 1 else (0, cpx)
        dense = np.zeros((co_t, g.kh, g.kw, wlen), np.int8)
        for co in range(co0, min(co0 + co_t, cout)):
            gi = co // cout_g
            phys = chanx[gi * cin_g : (gi + 1) * cin_g] - win0
            dense[co - co0][:, :, phys] = weights[co].transpose(1, 2, 0)
        reads = _tile_reads(chanx, cout, groups, cin_g, co0, co_t, win0, wlen)
        chunks, blocks, reach, subs, ks = [], [], [], [], []
        depthwise = groups > 1 and cin_g == 1 and cout_g == 1
        for c0 in range(0, wlen, plan.ci_t):
            cl = min(plan.ci_t, wlen - c0)
            chunks.append((c0, cl))
            block = np.ascontiguousarray(dense[..., c0 : c0 + cl])
            subs.append(narrow_subs(cfg, reads[:, c0 : c0 + cl], block, ex) if depthwise else None)
            blocks.append(block)
            read = np.flatnonzero(reads[:, c0 : c0 + cl].any(axis=0))
            ks.append(int(read[-1]) + 1 if len(read) else cl)
            reach.append(_reach(reads[:, c0 : c0 + cl], cfg.pes_per_cluster))
        packed = plan.ci_t if _packs(reach) else 0
        if packed:  # row c: column c's chunk's weights, each tap's `ci_t` channels apart
            one = np.zeros((co_t, g.kh, g.kw, packed), np.int8)
            for (_, cl), block, (lo, hi) in zip(chunks, blocks, reach, strict=True):
                one[lo:hi, ..., :cl] = block[lo:hi]
            addrs = [const(one.tobytes(), f"{where} weights")] * len(chunks)
        else:
            addrs = [const(block.tobytes(), f"{where} weights") for block in blocks]
        tiles.append(ConvTile(co0, co_t, win0, chunks, addrs, reach, wlen, subs, ks, packed))
    return tiles


def _conv_buffers(
    cfg, plan, gp, tiles, taps: int, px: BandPixels, ex: int, ey: int, post: OutputPass | None,
    block: int = 0, pair: bool = False,
):  # fmt: skip
    """On-chip double buffers of a convolution: (weights, input bands, outputs, accumulators), and
    (table, scratch, bias block, a residual's two tile buffers) - one scratch: the vector unit runs
    the bands in turn (a residual's tiles, loaded when a band starts, after the function's own
    scratch); the bias block (`block` bytes, compiler/bias.py) after it - on a banked scratchpad only
    its A row, its digits after the weights (their address last in the tuple; None otherwise).
    `pair` (`SecondConv`): each weight buffer holds the second convolution's block after the first's,
    at `round_up(wbytes, lanes)`, and a third accumulator tile is the second's (one: its VMAP runs
    under the first's MATMULs of the same band, before the next band's second MATMULs need it)."""
    m_max = _conv_m(gp, plan.rows, plan.band_mode, px)
    in_bytes = px.bytes(gp, plan.rows, ex)
    wbytes = _weight_bytes(cfg, plan.co_t, taps * plan.ci_t, pair)
    single_w = len(tiles) == 1 and (len(tiles[0].chunks) == 1 or bool(tiles[0].packed))
    act_bytes, w_base = spad_regions(cfg)
    w_bufs = [w_base] if single_w else [w_base, w_base + round_up(wbytes, cfg.lanes)]
    base = 0 if cfg.spad_banked else w_bufs[-1] + round_up(wbytes, cfg.lanes)
    in_bufs = [base, base + round_up(in_bytes, cfg.lanes)]
    base = in_bufs[1] + round_up(in_bytes, cfg.lanes)
    out_bufs = [base, base + round_up(m_max * plan.co_t * ey, cfg.lanes)]
    acc_tile = m_max * acc_row_stride(cfg, plan.co_t)
    acc_bufs = [ACC_BASE + i * acc_tile for i in range(3 if pair else 2)]
    end = out_bufs[1] + round_up(m_max * plan.co_t * ey, cfg.lanes)
    table = end
    if post is not None and post.table is not None:
        end += round_up(LUT_BYTES, cfg.lanes)
    scratch = end
    tile = m_max * plan.co_t
    res = [scratch + tile * (post.own if post else 0) + i * tile * ey for i in (0, 1)]  # a residual's
    end = round_up(end + tile * (post.scratch if post else 0), cfg.lanes)
    bias_block = end
    digits = None
    if block and cfg.spad_banked:  # the digits after the weights, in the other banks than the A row
        a_row = biasmm.a_bytes(cfg.lanes)
        digits = w_bufs[-1] + round_up(wbytes, cfg.lanes)
        assert digits + block - a_row <= cfg.spad_bytes
        block = a_row
    end += block
    assert end <= act_bytes and len(acc_bufs) * acc_tile <= cfg.acc_bytes
    assert w_bufs[-1] + wbytes <= cfg.spad_bytes
    return w_bufs, in_bufs, out_bufs, acc_bufs, (table, scratch, bias_block, res, digits)


def _conv_matmuls(
    b, cfg, g, gs, t, band_mode, wb, c0, cl, ib, ab, m, rows, px: BandPixels, ex, reach, windowed,
    w_row: int = 0,
) -> None:  # fmt: skip
    """One input chunk's MATMULs for a band: one per tap (band mode: the whole band at once; else
    one per output row), over the output columns `reach` the chunk feeds. `px`: how the band holds
    its pixels. `w_row`: the channels a tap takes in the weight rows, when more than `cl` (a
    depthwise chunk's MATMULs of one word each read the first `cl` of each tap)."""
    taps = g.kh * g.kw
    c_stride = acc_row_stride(cfg, t.co_t)
    w_row = w_row or cl
    b_stride = bank_stride(cfg, taps * w_row, cfg.lanes)
    lo, hi = reach
    p = px.pitch
    row = px.row(gs.wp) * p * ex  # bytes of a band row
    for ky in range(g.kh):
        for kx in range(g.kw):
            bw = wb + (ky * g.kw + kx) * w_row + lo * b_stride
            # bytes into the band of the tap's first A row (a phased band's: in the tap's plane)
            if px.phased:
                tap = (t.base(windowed) + c0 + px.tap(ky, kx, gs.wp) * p) * ex
            else:
                tap = ky * g.dh * row + (t.base(windowed) + c0 + px.col(kx * g.dw, gs.wp) * p) * ex
            if band_mode:
                b.add(
                    "matmul",
                    a=ib + tap,
                    b=bw,
                    c=ab + 4 * lo,
                    m=m,
                    n=hi - lo,
                    k=cl,
                    a_stride=p * ex,
                    b_stride=b_stride,
                    c_stride=c_stride,
                    accumulate=1,
                    a_i16=int(ex == 2),
                )
            else:
                for r in range(rows):
                    b.add(
                        "matmul",
                        a=ib + r * g.sh * row + tap,
                        b=bw,
                        c=ab + r * gs.ow * c_stride + 4 * lo,
                        m=gs.ow,
                        n=hi - lo,
                        k=cl,
                        a_stride=(g.sw if px.planes == 1 else 1) * p * ex,
                        b_stride=b_stride,
                        c_stride=c_stride,
                        accumulate=1,
                        a_i16=int(ex == 2),
                    )


def _conv_output(
    b, y, rq, g, gs, t, wv, n, y0, x0, rows, m, ab, ob, cpy, ey, c_stride, out_pass, skip: int = 0
) -> None:
    """A band's results to DRAM: int32 accumulators as they are (rq None), or requantised (and
    through `out_pass`: (OutputPass, table, scratch, the output's real channels), where given;
    `skip`: where a residual's other operand's tile is; `wv`: A-row slots an output row takes)."""
    if rq is None:  # int32 results: each output row's pixels straight from the accumulators
        out = y.addr + (((n * g.oh + y0) * g.ow + x0) * cpy + t.co0) * 4
        if wv == gs.ow == g.ow:  # the band's pixels are the output's, back to back
            b.add("store", spad=ab, dram=out, rows=rows * g.ow, cols=4 * t.co_t, spad_stride=c_stride,
                  dram_stride=4 * cpy, label="output (int32)")  # fmt: skip
            return
        for r in range(rows):
            b.add(
                "store",
                spad=ab + r * wv * c_stride,
                dram=out + r * g.ow * cpy * 4,
                rows=gs.ow,
                cols=4 * t.co_t,
                spad_stride=c_stride,
                dram_stride=4 * cpy,
                label="output (int32)",
            )
        return
    if isinstance(out_pass, pointwise.Fused):  # a 1 x 1 convolution of the tile instead of its store
        assert t.co0 == 0 and t.co_t == cpy
        return pointwise.band(b, out_pass, rq, (ab, c_stride), ob, cpy, ey, m, (g, gs, n, y0, x0, rows, wv))
    add_requant(
        b, rq, t.co0, src=ab, dst=ob, rows=m, cols=t.co_t, src_stride=c_stride, dst_stride=t.co_t * ey,
    )  # fmt: skip
    if out_pass is not None:
        post, table, scratch, chan = out_pass
        ob = post.emit(b, ob, m * t.co_t, t.co_t, _pad_runs(chan, t.co0, t.co_t), table, scratch, skip)
    at = (((n * g.oh + y0) * g.ow + x0) * cpy + t.co0) * ey  # the tile's first byte in the tensor
    _tile_dma(b, "store", ob, y.addr + at, g, gs, t, rows, wv, cpy, ey, "output")


def _load_residual(b, post, bufs, k: int, g, gs, t, n, y0, x0, rows: int, wv: int, cpy: int, ey: int):
    """The residual's other operand's tile for a band (`post.residual`), arranged as the output's,
    into its buffer of the band's parity when the band starts (under the band's MATMULs, not after
    them on the in-order load unit); where it is (0: no residual)."""
    if post is None or post.residual is None:
        return 0
    if post.residual.addr is None:  # computed in the band (`SecondConv`): nothing to load
        return bufs[k % 2]
    at = (((n * g.oh + y0) * g.ow + x0) * cpy + t.co0) * ey
    _tile_dma(b, "load", bufs[k % 2], post.residual.addr + at, g, gs, t, rows, wv, cpy, ey,
              f"residual {post.residual.name}")  # fmt: skip
    return bufs[k % 2]


def _tile_dma(b, op: str, spad: int, dram: int, g, gs, t, rows: int, wv: int, cpy: int, ey: int, label: str):
    """A requantised output tile between the scratchpad (rows of `wv` pixel slots of `t.co_t`
    elements) and its place in an HWC tensor (`dram` its first byte): the output's store, or the
    load of a residual's other operand of the same layout."""
    if t.co_t == cpy:
        b.add(op, spad=spad, dram=dram, rows=rows, cols=gs.ow * cpy * ey, spad_stride=wv * cpy * ey,
              dram_stride=g.ow * cpy * ey, label=label)  # fmt: skip
        return
    if wv == gs.ow == g.ow:  # the band's pixels are the output's, back to back: one DMA row each
        b.add(op, spad=spad, dram=dram, rows=rows * g.ow, cols=t.co_t * ey, spad_stride=t.co_t * ey,
              dram_stride=cpy * ey, label=label)  # fmt: skip
        return
    for r in range(rows):
        b.add(op, spad=spad + r * wv * t.co_t * ey, dram=dram + r * g.ow * cpy * ey, rows=gs.ow,
              cols=t.co_t * ey, spad_stride=t.co_t * ey, dram_stride=cpy * ey, label=label)  # fmt: skip


def _pad_runs(chan, co0: int, co_t: int) -> list[tuple[int, int]]:
    """(offset, width) runs of a tile's columns co0 .. co0 + co_t - 1 that are channel padding."""
    real = set(chan)
    runs: list[tuple[int, int]] = []
    for j in range(co_t):
        if co0 + j in real:
            continue
        if runs and runs[-1][0] + runs[-1][1] == j:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((j, 1))
    return runs


def pool_program(
    b: ProgramBuilder,
    cfg: NpuConfig,
    x: Act,
    y: Act,
    g: Geometry,
    mode: int,
    rq: dict,
    rescale: dict | None,
    where: str,
    max_step: int = 0,
) -> dict:
    """Emit max (mode 0) or average (mode 1) pooling; `rq` holds the POOL's requantisation fields,
    `rescale` an optional in-place VMAP after a max pool whose output is quantised differently."""
    ca = channel_align(cfg)
    cp = x.layout.cp
    e = x.layout.elem  # int16: 2 bytes an element (the output has the same type)
    flags = {"src_i16": 1, "dst_i16": 1} if e == 2 else {}
    fill = -128 if mode == 0 else x.q.zero_point  # int16: the high byte (-32768 for max pooling)
    if g.kh > 255 or g.kw > 255 or g.sh > 255 or g.sw > 255:
        raise CompileError(f"{where}: pooling window or stride above 255")
    # a max over a kh x kw window is the max over kw columns of maxima over kh rows: two passes
    # (kh x 1 over the padded width, then 1 x kw) take kh * wp + kw * ow steps a row instead of
    # kh * kw * ow (not for a 3 x 3 stride-2 pool, whose first pass would cover the whole width)
    separable = mode == 0 and g.kh > 1 and g.kw > 1 and g.kh * g.wp + g.kw * g.ow < g.kh * g.kw * g.ow
    cts = sorted({cp} | {max(ca, round_up(cdiv(cp, d), ca)) for d in (2, 4, 8, 16, 32, 64)}, reverse=True)
    best = None
    for ct in cts:
        vec = cdiv(ct, cfg.vector_lanes)  # int8 or int16 elements a step
        lo, hi, rows = 1, g.oh, 0
        while lo <= hi:
            r = (lo + hi) // 2
            mid = r * g.wp * ct * e if separable else 0
            need = 2 * (g.in_rows(r) * g.wp * ct + r * g.ow * ct) * e + mid
            taps = g.kh * g.wp + g.kw * g.ow if separable else g.kh * g.kw * g.ow
            step = r * taps * vec
            if (
                need <= spad_regions(cfg)[0]
                and g.wp * ct * e <= 0xFFFF
                # with a cancellation interval a band must not take longer than a step: fewer rows,
                # then narrower channel tiles (one row of the narrowest tile is the least there is)
                and (not max_step or step <= max_step or (r == 1 and ct == cts[-1]))
            ):
                rows, lo = r, r + 1
            else:
                hi = r - 1
        if rows:
            best = (ct, rows)
            break
    if best is None:
        need = 2 * (g.in_rows(1) * g.wp * ca + g.ow * ca)
        raise CompileError(
            f"{where}: one pooling row band does not fit {memory_name(cfg)}: {ca} channels of one output "
            f"row (input width {g.wp}) need {need} bytes"
        )
    ct, rows_max = best
    in_bytes = g.in_rows(rows_max) * g.wp * ct * e
    out_bytes = rows_max * g.ow * ct * e
    in_bufs = [0, round_up(in_bytes, cfg.lanes)]
    o0 = 2 * in_bufs[1]
    out_bufs = [o0, o0 + round_up(out_bytes, cfg.lanes)]
    mid = out_bufs[1] + round_up(out_bytes, cfg.lanes)  # the separable pool's column maxima
    mid_bytes = rows_max * g.wp * ct * e if separable else 0
    k = 0
    for c0 in range(0, cp, ct):
        cl = min(ct, cp - c0)  # the last channel tile may be narrower
        for n in range(g.n):
            for y0 in range(0, g.oh, rows_max):
                rows = min(rows_max, g.oh - y0)
                ib, ob = in_bufs[k % 2], out_bufs[k % 2]
                k += 1
                _load_band(b, x, g, n, y0, rows, ib, fill, f"input n{n} y{y0}", c0=c0, cl=cl)
                if separable:
                    b.add("pool", src=ib, dst=mid, channels=cl, in_w=g.wp, out_h=rows, out_w=g.wp, kh=g.kh,
                          kw=1, sh=g.sh, sw=1, mode=mode, **rq, **flags)  # fmt: skip
                    b.add("pool", src=mid, dst=ob, channels=cl, in_w=g.wp, out_h=rows, out_w=g.ow, kh=1,
                          kw=g.kw, sh=1, sw=g.sw, mode=mode, **rq, **flags)  # fmt: skip
                else:
                    b.add("pool", src=ib, dst=ob, channels=cl, in_w=g.wp, out_h=rows, out_w=g.ow, kh=g.kh,
                          kw=g.kw, sh=g.sh, sw=g.sw, mode=mode, **rq, **flags)  # fmt: skip
                row = g.ow * cl
                if rescale is not None:
                    b.add("vmap", src=ob, dst=ob, rows=rows, cols=row, src_stride=row * e, dst_stride=row * e,
                          **rescale, **flags)  # fmt: skip
                out = y.addr + (((n * g.oh + y0) * g.ow) * cp + c0) * e
                if cl == cp:
                    b.add("store", spad=ob, dram=out, rows=rows, cols=row * e, spad_stride=row * e,
                          dram_stride=row * e)  # fmt: skip
                else:
                    b.add("store", spad=ob, dram=out, rows=rows * g.ow, cols=cl * e, spad_stride=cl * e,
                          dram_stride=cp * e)  # fmt: skip
                b.candidate()
    parts = ([f"frame x{g.n}"] if g.n > 1 else []) + ([f"channel x{cdiv(cp, ct)}"] if ct < cp else [])
    if rows_max < g.oh:
        parts.append(f"height x{cdiv(g.oh, rows_max)} (halo {max(g.kh - g.sh, 0)})")
    if separable:
        parts.append(f"separable ({g.kh}x1 then 1x{g.kw})")
    return {
        "split": ", ".join(parts) or "none",
        "tile": {"c": ct, "rows": rows_max},
        "spad_bytes": 2 * (in_bytes + out_bytes) + mid_bytes,
    }


def global_pool_program(b: ProgramBuilder, cfg: NpuConfig, x: Act, y: Act, where: str) -> dict:
    """GlobalAveragePool of a map whose rows do not fit the scratchpad at once (or are more than a
    POOL window's 255): the mean of every group of `g` rows (one row unless the map is taller than
    255 rows; `g` divides the height, so every group weighs the same) is kept on chip as int8 at the
    input's quantisation, then the groups' means are averaged and requantised to the output's. The
    rows come in bands of `r` rows (a multiple of `g` that divides the height), as many as fit.
    The mean of equal groups' means is the mean; the price is one extra rounding per group, half a
    step of the input's scale at most, which averages out over the groups (the error of the result
    shrinks with the square root of their number)."""
    ca = channel_align(cfg)
    n_frames, _, h, w = x.layout.nchw
    cp, cpy = x.layout.cp, y.layout.cp
    e = x.layout.elem  # int16: 2 bytes an element (the output and the group means too)
    flags = {"src_i16": 1, "dst_i16": 1} if e == 2 else {}
    if w > 255:
        raise CompileError(f"{where}: global pooling over rows of {w} pixels exceeds a POOL window's 255")
    g = next(d for d in range(1, h + 1) if h % d == 0 and h // d <= 255)  # rows per group
    ng = h // g
    act = spad_regions(cfg)[0]
    best = None
    tiles = {cp} | {max(ca, round_up(cdiv(cp, d), ca)) for d in (2, 4, 8, 16, 32, 64)}
    for ct in sorted(tiles, reverse=True):
        for r in sorted((d for d in range(g, h + 1, g) if h % d == 0), reverse=True):
            if 2 * round_up(r * w * ct * e, cfg.lanes) + round_up(ng * ct * e, cfg.lanes) + 2 * ct * e <= act:
                best = (ct, r)
                break
        if best:
            break
    if best is None:
        raise CompileError(
            f"{where}: global pooling of {h} x {w} pixels does not fit {memory_name(cfg)} even in bands "
            f"of {g} rows and {ca} channels"
        )
    ct, r = best
    zx = x.q.zero_point
    group = dict(zip(("mult", "shift"), quant_multiplier(1 / (g * w), where), strict=True))
    group.update(zp_in=zx, zp_out=zx, lo=-128, hi=127)
    final = dict(zip(("mult", "shift"), quant_multiplier(x.q.scale / (y.q.scale * ng), where), strict=True))
    final.update(zp_in=zx, zp_out=y.q.zero_point, lo=-128, hi=127)
    step = round_up(r * w * ct * e, cfg.lanes)
    in_bufs = [0, step]
    part = 2 * step
    o0 = part + round_up(ng * ct * e, cfg.lanes)
    out_bufs = [o0, o0 + round_up(ct * e, cfg.lanes)]
    k = t = 0
    for c0 in range(0, cp, ct):
        cl = min(ct, cp - c0)
        for n in range(n_frames):
            for y0 in range(0, h, r):
                ib = in_bufs[k % 2]
                k += 1
                first = x.addr + ((n * h + y0) * w) * cp * e
                if cl == cp:
                    b.add("load", spad=ib, dram=first, rows=r, cols=w * cp * e, spad_stride=w * cp * e,
                          dram_stride=w * cp * e, label=f"input n{n} rows {y0}")  # fmt: skip
                else:  # a channel slice: one DMA row per pixel
                    b.add("load", spad=ib, dram=first + c0 * e, rows=r * w, cols=cl * e, spad_stride=cl * e,
                          dram_stride=cp * e, label=f"input n{n} rows {y0} c{c0}")  # fmt: skip
                # one POOL per band: out_h groups of g rows, each averaged over its g x w pixels
                b.add("pool", src=ib, dst=part + (y0 // g) * cl * e, channels=cl, in_w=w, out_h=r // g,
                      out_w=1, kh=g, kw=w, sh=g, sw=1, mode=1, **group, **flags)  # fmt: skip
            ob = out_bufs[t % 2]
            t += 1
            b.add("pool", src=part, dst=ob, channels=cl, in_w=1, out_h=1, out_w=1, kh=ng, kw=1, sh=1,
                  sw=1, mode=1, **final, **flags)  # fmt: skip
            b.add("store", spad=ob, dram=y.addr + (n * cpy + c0) * e, rows=1, cols=cl * e, spad_stride=cl * e,
                  dram_stride=cl * e)  # fmt: skip
            b.candidate()  # between tiles: nothing on chip is live
    parts = [f"frame x{n_frames}"] if n_frames > 1 else []
    parts += [f"channel x{cdiv(cp, ct)}"] if ct < cp else []
    parts.append(f"height x{h // r}, means of {ng} row groups on chip")
    return {"split": ", ".join(parts), "tile": {"c": ct, "rows": r}, "spad_bytes": out_bufs[1] + ct}
