"""Element-wise operators and channel concatenation on DRAM tensors, chunked to the scratchpad.

Both operands of an element-wise operator share one layout, so the operator runs over the raw
buffer bytes (channel padding included: padding holds the zero point, which maps to the output's
zero point and stays harmless).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from npu.arith import round_up
from npu.config import NpuConfig
from npu.isa import LUT_BYTES
from npu.program import ProgramBuilder
from npu.tensors import Layout

from .quantize import Act, QTensor


def step_unit(lay: Layout) -> int:
    """The bytes an element-wise program may split at: a pixel's channels, or a row."""
    n = lay.cp if lay.kind != "dense" else (lay.shape[-1] if lay.shape and lay.shape[-1] <= 4096 else 1)
    return n * lay.elem


def i16_flags(elem: int, *operands: str) -> dict:
    """The `<operand>_i16` fields of a vector instruction whose operands are all `elem` bytes."""
    return {f"{o}_i16": 1 for o in operands} if elem == 2 else {}


def _step_bytes(cfg: NpuConfig, max_step: int) -> int:
    """Bytes one chunk may hold so that moving it takes about `max_step` cycles (0: no limit)."""
    return max_step * min(cfg.bus_bytes, cfg.vector_lanes) // 2 if max_step else 1 << 30


def _chunks(n: int, chunk: int):
    for off in range(0, n, chunk):
        yield off, min(chunk, n - off)


def _rows(c: int, width: int) -> tuple[int, int]:
    """Shape a contiguous run of c bytes as rows x cols with cols <= 65535 (c is a multiple of width)."""
    return (c // width, width) if c > 0xFFFF else (1, c)


def _chunk(cfg: NpuConfig, unit: int, room: int, max_step: int) -> int:
    """Bytes per chunk: whole units, at most `room` and a DMA row's 65535 units."""
    return max(unit, min(room, 0xFFFF * unit, _step_bytes(cfg, max_step)) // unit * unit)


def _reset_padding(
    b: ProgramBuilder, buf: int, c: int, unit: int, pad_runs, zp_out: int, elem: int = 1
) -> None:
    """Set the (offset, width) runs (elements) of each `unit` bytes of a chunk to the output zero
    point (the channel padding's value, elementwise.py's invariant)."""
    for start, width in pad_runs:
        p = buf + elem * start
        b.add("vmap", src=p, dst=p, rows=c // unit, cols=width, src_stride=unit, dst_stride=unit,
              mult=0, zp_out=zp_out, **i16_flags(elem, "src", "dst"))  # fmt: skip


def _chunked(
    b: ProgramBuilder,
    cfg: NpuConfig,
    srcs: tuple[int, ...],
    dst: int,
    n: int,
    unit: int,
    max_step: int,
    op: Callable[[list[int], int, int, int], None],
    head: int = 0,
) -> None:
    """Walk n bytes in chunks of whole `unit`s, double-buffered above `head` resident bytes at the
    bottom of the scratchpad: each chunk of every source is loaded, `op(bufs, c, rows, cols)`
    computes into the first buffer in place, and that is stored to `dst`."""
    k = len(srcs)
    chunk = _chunk(cfg, unit, (cfg.spad_bytes - head) // (2 * k), max_step)
    for i, (off, c) in enumerate(_chunks(n, chunk)):
        bufs = [head + (i % 2) * k * chunk + j * chunk for j in range(k)]
        rows, cols = _rows(c, unit)
        for buf, src in zip(bufs, srcs, strict=True):
            b.add("load", spad=buf, dram=src + off, rows=rows, cols=cols, spad_stride=cols, dram_stride=cols)
        op(bufs, c, rows, cols)
        b.add("store", spad=bufs[0], dram=dst + off, rows=rows, cols=cols, spad_stride=cols, dram_stride=cols)
        b.candidate()


def _load_resident(b: ProgramBuilder, cfg: NpuConfig, dram: int, n: int) -> int:
    """LOAD n bytes from `dram` to the bottom of the scratchpad (kept for the whole operator); the
    bytes they take, lanes-aligned."""
    b.add("load", spad=0, dram=dram, rows=1, cols=n, spad_stride=n, dram_stride=n)
    return round_up(n, cfg.lanes)


def eltwise_program(
    b: ProgramBuilder, cfg: NpuConfig, src: int, dst: int, n: int, params: dict, unit: int, max_step: int = 0,
    elem: int = 1,
) -> None:  # fmt: skip
    """A VMAP over n contiguous bytes of `elem`-byte elements, in place (`unit` divides n and every
    chunk)."""

    def op(bufs: list[int], c: int, rows: int, cols: int) -> None:
        x = bufs[0]
        b.add("vmap", src=x, dst=x, rows=rows, cols=cols // elem, src_stride=cols, dst_stride=cols,
              **params, **i16_flags(elem, "src", "dst"))  # fmt: skip

    _chunked(b, cfg, (src,), dst, n, unit, max_step, op)


def lut_program(
    b: ProgramBuilder,
    cfg: NpuConfig,
    src: int,
    dst: int,
    n: int,
    table: int,
    unit: int,
    pad_runs: list[tuple[int, int]],
    zp_out: int,
    max_step: int = 0,
) -> None:
    """A VLUT over n contiguous bytes with the 256-byte table at DRAM `table` (loaded once); the
    channel-padding runs (offset, width) of each `unit` are then set to the output zero point."""

    def op(bufs: list[int], c: int, rows: int, cols: int) -> None:
        x = bufs[0]
        b.add("vlut", src=x, dst=x, rows=rows, cols=cols, src_stride=cols, dst_stride=cols, table=0)
        _reset_padding(b, x, c, unit, pad_runs, zp_out)

    head = _load_resident(b, cfg, table, LUT_BYTES)
    _chunked(b, cfg, (src,), dst, n, unit, max_step, op, head)


@dataclass(frozen=True)
class ResidualAdd:
    """An Add of a producer's result and another activation of its layout at DRAM `addr` (a
    residual), done on each output tile before the store: the other operand's tile is loaded beside
    it (`addr` None: computed beside it, `spatial.SecondConv`) and one VADD (`params`, the Add's own;
    `first`: the producer's result is the Add's first operand) makes the Add's output, which is what
    the producer stores."""

    addr: int | None
    params: dict
    elem: int
    first: bool
    name: str  # the Add node (for the report)


@dataclass(frozen=True)
class OutputPass:
    """A function of one activation (ops/lut.py) that the activation's producer computes on each
    output tile before storing it, instead of a pass of its own over DRAM: one VLUT in place
    (`passes` None, int8) or int16 vector `passes` (`ops.lut.Unary16`), then the channel padding set
    to `zero` where `fix_padding`. `table`: DRAM address of the VLUT's 256 bytes (None: none).
    `lut` False: no function (only the `residual`). `residual`: an Add after it (`ResidualAdd`)."""

    table: int | None
    passes: list | None
    zero: int
    fix_padding: bool
    how: str
    lut: bool = True
    residual: ResidualAdd | None = None

    @property
    def scratch(self) -> int:
        """Scratch bytes an output element needs (int16 passes: an int16 and an int8 buffer, `own`;
        a residual: two of the other operand's elements, its tiles double-buffered)."""
        return self.own + (2 * self.residual.elem if self.residual else 0)

    @property
    def own(self) -> int:
        """Scratch bytes an output element's function needs (the residual's buffers follow)."""
        return 3 if self.passes is not None and self.lut else 0

    @property
    def steps(self) -> int:
        """Vector passes over the tile (for the planner's estimate)."""
        own = (len(self.passes) if self.passes is not None else 1) if self.lut else 0
        return own + (1 if self.residual else 0)

    def emit(
        self, b: ProgramBuilder, buf: int, c: int, unit: int, pad_runs, table: int, scratch: int,
        other: int = 0,
    ) -> int:  # fmt: skip
        """The passes over a tile of c elements (`unit` a pixel) at `buf`, the VLUT table resident
        at spad `table`, `scratch` free; returns where the result is. `other`: where the residual's
        other operand's tile is (loaded by the producer when the band starts)."""
        out = buf
        if self.lut and self.passes is None:
            rows, cols = _rows(c, unit)
            b.add("vlut", src=buf, dst=buf, rows=rows, cols=cols, src_stride=cols, dst_stride=cols,
                  table=table)  # fmt: skip
            e = 1
        elif self.lut:
            bufs = {"x": buf, "w": scratch, "n": scratch + 2 * c}
            out, e = _vector_passes(b, bufs, c, unit, self.passes, table), 2
        if self.lut and self.fix_padding:
            _reset_padding(b, out, e * c, e * unit, pad_runs, self.zero, e)
        r = self.residual
        if r is not None:
            a, bb = (out, other) if r.first else (other, out)
            b.add("vadd", a=a, b=bb, dst=out, len=c, **r.params, **i16_flags(r.elem, "a", "b", "dst"))
        return out


_SIZE = {"x": 2, "w": 2, "n": 1}  # element bytes of the int16 passes' buffers


def _vector_passes(b: ProgramBuilder, bufs: dict[str, int], c: int, unit: int, passes, table: int) -> int:
    """Unary16 `passes` over c int16 elements (`unit` a pixel or row) in `bufs` ("x" the source,
    "w" int16 and "n" int8 scratch), the VLUT table at spad `table`; returns the result's buffer."""
    rows, cols = _rows(2 * c, 2 * unit)  # a DMA row holds 65535 bytes
    cols //= 2
    for op, a, bb, d, fields in passes:
        flags = {}
        if op in ("vmap", "vlut"):
            f = dict(src=bufs[a], dst=bufs[d], rows=rows, cols=cols, src_stride=_SIZE[a] * cols,
                     dst_stride=_SIZE[d] * cols)  # fmt: skip
            if op == "vlut":
                f["table"] = table
            else:
                flags = {"src_i16": int(_SIZE[a] == 2), "dst_i16": int(_SIZE[d] == 2)}
        elif op == "vmul":
            f = dict(a=bufs[a], b=bufs[bb], dst=bufs[d], rows=rows, cols=cols, a_stride=_SIZE[a] * cols,
                     b_stride=_SIZE[bb] * cols, dst_stride=_SIZE[d] * cols)  # fmt: skip
        else:  # vadd over the whole chunk
            f = dict(a=bufs[a], b=bufs[bb], dst=bufs[d], len=c)
        if op in ("vmul", "vadd"):
            flags = {f"{k}_i16": int(_SIZE[v] == 2) for k, v in (("a", a), ("b", bb), ("dst", d))}
        b.add(op, **f, **{**fields, **flags})
    return bufs[passes[-1][3]]


def lut16_program(
    b: ProgramBuilder,
    cfg: NpuConfig,
    src: int,
    dst: int,
    n: int,
    table: int | None,
    unit: int,
    pad_runs: list[tuple[int, int]],
    passes: list[tuple[str, str, str | None, str, dict]],
    yq: QTensor,
    max_step: int = 0,
) -> None:
    """A function of n int16 elements (`unit` elements a pixel or row) as vector `passes` (ops/lut.py
    `Unary16`) over each chunk's buffers: "x" (the source, int16), "w" (int16 scratch) and "n" (int8
    scratch); a VLUT's table at DRAM `table` is loaded once. Channel-padding runs (offset, width)
    of the result then get the output's zero point. Chunks are double-buffered."""
    ey = yq.elem
    head = _load_resident(b, cfg, table, LUT_BYTES) if table is not None else 0
    per = _chunk(cfg, unit, (cfg.spad_bytes - head) // 10, max_step // 4 if max_step else 0)
    slot = round_up(5 * per, cfg.lanes)
    for i, (off, c) in enumerate(_chunks(n, per)):
        base = head + (i % 2) * slot
        bufs = {"x": base, "w": base + 2 * per, "n": base + 4 * per}
        rows, cols = _rows(2 * c, 2 * unit)  # a DMA row holds 65535 bytes
        cols //= 2
        b.add("load", spad=bufs["x"], dram=src + 2 * off, rows=rows, cols=2 * cols, spad_stride=2 * cols,
              dram_stride=2 * cols)  # fmt: skip
        out = _vector_passes(b, bufs, c, unit, passes, 0)
        assert _SIZE[passes[-1][3]] == ey
        _reset_padding(b, out, ey * c, ey * unit, pad_runs, yq.zero_point, ey)
        b.add("store", spad=out, dram=dst + ey * off, rows=rows, cols=ey * cols, spad_stride=ey * cols,
              dram_stride=ey * cols)  # fmt: skip
        b.candidate()


def add_program(
    b: ProgramBuilder,
    cfg: NpuConfig,
    a: int,
    bb: int,
    dst: int,
    n: int,
    params: dict,
    unit: int,
    max_step: int = 0,
    elem: int = 1,
) -> None:
    """VADD over n contiguous bytes of `elem`-byte elements of two tensors."""

    def op(bufs: list[int], c: int, rows: int, cols: int) -> None:
        b.add("vadd", a=bufs[0], b=bufs[1], dst=bufs[0], len=c // elem, **params,
              **i16_flags(elem, "a", "b", "dst"))  # fmt: skip

    _chunked(b, cfg, (a, bb), dst, n, unit, max_step, op)


def mul_program(
    b: ProgramBuilder,
    cfg: NpuConfig,
    a: int,
    bb: int,
    dst: int,
    n: int,
    params: dict,
    unit: int,
    row: int = 0,
    pad_runs: tuple[tuple[int, int], ...] = (),
    max_step: int = 0,
    elem: int = 1,
) -> None:
    """VMUL over n contiguous bytes (`elem`-byte elements) of a and, with `row` = 0, as many of b;
    else b is one row of `row` elements multiplied into every `unit` bytes of a (a per-channel
    gate: the first `row` elements of each pixel). `pad_runs` (offset, width: elements) of each unit
    are then set to the output zero point (elements the product does not cover)."""
    flags = i16_flags(elem, "a", "b", "dst")

    def op(bufs: list[int], c: int, rows: int, cols: int) -> None:
        x = bufs[0]
        if row:
            b.add("vmul", a=x, b=0, dst=x, rows=c // unit, cols=row, a_stride=unit, b_stride=0,
                  dst_stride=unit, **params, **flags)  # fmt: skip
        else:
            b.add("vmul", a=x, b=bufs[1], dst=x, rows=rows, cols=cols // elem, a_stride=cols, b_stride=cols,
                  dst_stride=cols, **params, **flags)  # fmt: skip
        _reset_padding(b, x, c, unit, pad_runs, params["zp_out"], elem)

    if row:
        _chunked(b, cfg, (a,), dst, n, unit, max_step, op, _load_resident(b, cfg, bb, row * elem))
    else:
        _chunked(b, cfg, (a, bb), dst, n, unit, max_step, op)


def concat_program(
    b: ProgramBuilder,
    cfg: NpuConfig,
    parts: list[tuple[Act, int, int, dict | None]],
    y: Act,
    pixels: int,
    max_step: int = 0,
    out_w: int | None = None,
) -> None:
    """Copy each input (act, width in bytes per pixel, byte offset in an output pixel, rescale) into
    its slice of the output's pixels; `rescale` is a VMAP when the input is quantised differently
    (inputs and output share one element type). `out_w`: bytes of an output pixel (row) when not
    its channel pitch or second dimension."""
    e = y.layout.elem
    if out_w is None:
        out_w = (y.layout.cp if y.layout.kind == "hwc" else y.q.shape[1]) * e
    k = 0
    for act, width, off, rescale in parts:
        per = max(1, min(0xFFFF, (cfg.spad_bytes // 2) // width, _step_bytes(cfg, max_step) // width))
        for p0, pc in _chunks(pixels, per):
            buf = (k % 2) * (cfg.spad_bytes // 2)
            k += 1
            b.add(
                "load",
                spad=buf,
                dram=act.addr + p0 * width,
                rows=pc,
                cols=width,
                spad_stride=width,
                dram_stride=width,
            )
            if rescale is not None:
                b.add(
                    "vmap",
                    src=buf,
                    dst=buf,
                    rows=pc,
                    cols=width // e,
                    src_stride=width,
                    dst_stride=width,
                    **rescale,
                    **i16_flags(e, "src", "dst"),
                )
            b.add(
                "store",
                spad=buf,
                dram=y.addr + p0 * out_w + off,
                rows=pc,
                cols=width,
                spad_stride=width,
                dram_stride=out_w,
            )
            b.candidate()
