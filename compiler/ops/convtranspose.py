"""ConvTranspose whose stride equals its kernel (a segmentation head's 2x upsampling): every output
pixel gets exactly one tap, so for each input row and kernel row `dy` it is one GEMM of the row's
pixels (m = W, k = input channels) by that kernel row's taps (n = kw x output channels), stored
straight into output row `y * kh + dy` (pixel x's kw taps are its kw neighbouring output pixels)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np
import onnx

from npu.arith import round_up
from npu.program import ProgramBuilder
from npu.tensors import Layout
from npu.timing import bank_stride

from ..graph import CompileError, node_attrs
from ..programs import choose_tiling, gemm_program
from ..quantize import channel_requant
from ..region import memory_name
from .lut import check as lut_check
from .lut import plan as lut_plan
from .registry import rule

if TYPE_CHECKING:
    from ..lower import Lowerer


def convtranspose_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    a = node_attrs(n)
    k = list(a.get("kernel_shape", ctx.shape(n.input[1], n)[2:]))
    if a.get("group", 1) != 1 or any(d != 1 for d in a.get("dilations", [1, 1])):
        return "a grouped or dilated transposed convolution"
    if list(a.get("strides", [1, 1])) != k or any(a.get("pads", [0])) or any(a.get("output_padding", [0])):
        return "a transposed convolution whose stride is not its kernel, or with padding"
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        return "a transposed convolution with auto_pad"
    if ctx.src_kind(n.input[1]) != "const" or ctx.act_in(n.input[0], n).layout.kind != "hwc":
        return "a transposed convolution with weights computed at run time or a non-NCHW input"
    try:
        ctx.weights(n.input[1], n, out_axis=1)
    except CompileError as e:  # quantised along another axis, asymmetric, ...
        return str(e).split(": ", 2)[-1]
    if ctx.act_in(n.input[0], n).q.elem != ctx.q_out(n.output[0], n).elem:
        return "a transposed convolution from int8 to int16 or back"
    return None


def dense_group(ctx: Lowerer, name: str, cout: int, kw: int, wd: int) -> int | None:
    """Input pixels a GEMM row takes when the output (quantised tensor `name`) is stored dense: one
    output channel, read only by table functions on the NPU (which take any layout) or as a graph
    output (the host unpacks any layout), and `g` dividing the row's width; else None (HWC)."""
    if cout != 1:
        return None
    n = math.lcm(ctx.ca, kw)  # output columns a GEMM row makes: whole lane words of pixels
    g = n // kw
    if g < 2 or wd % g:
        return None
    return g if _read_densely(ctx, name) else None


def _read_densely(ctx: Lowerer, name: str, depth: int = 0) -> bool:
    """Whether every reader of the quantised tensor `name` takes it in any layout: the host (placed
    there already), or a table function on the NPU whose output (laid out as its input) is read so
    in turn; a graph output is unpacked by the host."""
    luts = lut_plan(ctx)
    for t in ctx._lut_readers.get(name, []):
        key = t.name or t.output[0]
        if key in ctx.reasons or key in ctx.host_nodes:
            continue  # the host unpacks any layout
        if key not in luts or luts[key].source != name or lut_check(ctx, t) is not None:
            return False
        if depth >= 8 or not _read_densely(ctx, ctx.q_out(t.output[0], t).name, depth + 1):
            return False  # (a Conv after the Sigmoid needs a feature map)
    return True


def _dense_taps(w: np.ndarray, bias: np.ndarray, chan: np.ndarray, cp_in: int, g: int, zp: int):
    """Per kernel row dy: B^T (g * kw, g * cp_in) and its bias, for one output channel stored dense:
    column p * kw + dx makes output pixel (x0 + p) * kw + dx from input pixel x0 + p."""
    cin, _, kh, kw = w.shape
    out = []
    for dy in range(kh):
        bt = np.zeros((g * kw, g * cp_in), np.int8)
        fb = np.zeros(g * kw, np.int64)
        for p in range(g):
            for dx in range(kw):
                tap = w[:, 0, dy, dx].astype(np.int64)  # (Cin,)
                bt[p * kw + dx, p * cp_in + chan] = tap
                fb[p * kw + dx] = bias[0] - zp * tap.sum()
        out.append((bt, fb))
    return out


@rule("ConvTranspose", check=convtranspose_check, int16=True)
def lower_convtranspose(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    where = ctx.where(n)
    x = ctx.act_in(n.input[0], n)
    w, s_w = ctx.weights(n.input[1], n, out_axis=1)  # (Cin, Cout, kh, kw), one scale per Cout
    cin, cout, kh, kw = w.shape
    bn, _, h, wd = x.layout.nchw
    cp_in = x.layout.cp
    bias = ctx.bias(n, 2, cout, x, s_w)
    yq, relu = ctx.q_out(n.output[0], n), False
    if (relu_q := ctx.fuse_relu(n.output[0])) is not None:
        yq, relu = relu_q, True  # straight to the Relu's output, clamped at zero
    if tuple(yq.shape) != (bn, cout, h * kh, wd * kw):
        raise CompileError(f"{where}: output shape {yq.shape} does not follow from the attributes")
    e = x.layout.elem  # int16 activations: 2 bytes an element, in and out
    g = dense_group(ctx, yq.name, cout, kw, wd)
    if g is not None:
        _lower_dense(ctx, n, b, x, w, s_w, bias, yq, relu, g)
        return
    cp = bank_stride(ctx.cfg, round_up(cout, ctx.ca), ctx.ca, elem=e)
    y = ctx.place(yq, f"{where} output", Layout.hwc(yq.shape, ctx.ca, cp=cp, elem=e))
    s_cols = np.tile(np.concatenate([s_w, np.full(cp - cout, s_w[0])]), kw)  # column dx * cp + co
    cfg, rq = ctx.per_column(b, channel_requant(x.q, s_cols, yq, where), where)
    nn = kw * cp
    chan = np.asarray(x.layout.chan)
    taps = []  # per kernel row: B^T (kw * cp, cp_in) and its bias with the input zero point folded
    for dy in range(kh):
        bt = np.zeros((nn, cp_in), np.int8)
        fb = np.zeros(nn, np.int64)
        for dx in range(kw):
            tap = w[:, :, dy, dx].astype(np.int64)  # (Cin, Cout)
            bt[dx * cp : dx * cp + cout][:, chan] = tap.T
            fb[dx * cp : dx * cp + cout] = bias - x.q.zero_point * tap.sum(axis=0)
        taps.append((bt, fb))
    _gemm_rows(ctx, n, b, cfg, rq, x, y, yq, relu, taps, (wd, nn, cp_in), wd * kw * cp * e)
    ctx.op_done(n, b, yq.shape, {"split": f"rows x{bn * h}, kernel rows x{kh}"})


def _gemm_rows(
    ctx: Lowerer, n, b: ProgramBuilder, cfg, rq, x, y, yq, relu: bool, taps, mnk, row_out: int
) -> None:
    """Per input row and kernel row dy, the GEMM (m, n, k = `mnk`) of the row by `taps[dy]` (B^T and
    its int64 bias), into output row `y * kh + dy` (`row_out` bytes a row). The biases of every
    kernel row start the accumulators by one MATMUL block where that pays (`Lowerer.gemm_bias`)."""
    where = ctx.where(n)
    m, nn, k = mnk
    bn, _, h, wd = x.layout.nchw
    e, kh = x.layout.elem, len(taps)
    biases = np.concatenate([fb for _, fb in taps])
    if np.abs(biases).max(initial=0) >= 2**31:
        raise CompileError(f"{where}: folded bias overflows int32")
    try:
        tiling_for = lambda c: choose_tiling(c, m, nn, k, e, e)  # noqa: E731
        tiling, block = ctx.gemm_bias(b, cfg, biases, where, tiling_for, (m, nn), bn * h * kh)
    except ValueError:
        raise CompileError(f"{where}: no GEMM tiling of {m}x{nn}x{k} fits {memory_name(cfg)}") from None
    addrs = []
    for dy, (bt, fb) in enumerate(taps):
        bias_addr = None if block else ctx.const(fb.astype("<i4").tobytes(), f"{where} bias row {dy}")
        addrs.append((ctx.const(bt.tobytes(), f"{where} weights row {dy}"), bias_addr))
    for f in range(bn):
        for yy in range(h):
            a_addr = x.addr + (f * h + yy) * wd * x.layout.cp * e
            for dy, (bt_addr, bias_addr) in enumerate(addrs):
                c_addr = y.addr + ((f * h + yy) * kh + dy) * row_out
                bias_mm = dataclasses.replace(block, col0=dy * nn) if block else None
                gemm_program(cfg, m, nn, k, a_addr, bt_addr, c_addr, mult=rq["mult"], shift=rq["shift"],
                             zp_out=yq.zero_point, bias_addr=bias_addr, tiling=tiling, builder=b,
                             per_col=rq.get("per_col"), relu=relu, ea=e, ey=e, bias_mm=bias_mm)  # fmt: skip
            b.candidate()


def _lower_dense(
    ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder, x, w, s_w, bias, yq, relu: bool, g: int
) -> None:
    """One output channel stored dense (`dense_group`): per input row and kernel row, a GEMM of
    m = W / g rows of g input pixels (k = g x cp_in) by g x kw columns, C row-major is the output
    row's pixels."""
    where = ctx.where(n)
    cin, cout, kh, kw = w.shape
    bn, _, h, wd = x.layout.nchw
    cp_in, e = x.layout.cp, x.layout.elem
    y = ctx.place(yq, f"{where} output", Layout.dense(yq.shape, e))
    m, nn, k = wd // g, g * kw, g * cp_in
    cfg, rq = ctx.per_column(b, channel_requant(x.q, np.full(nn, s_w[0]), yq, where), where)
    taps = _dense_taps(w, bias, np.asarray(x.layout.chan), cp_in, g, x.q.zero_point)
    _gemm_rows(ctx, n, b, cfg, rq, x, y, yq, relu, taps, (m, nn, k), wd * kw * e)
    split = f"rows x{bn * h}, kernel rows x{kh}, one channel stored dense ({g} input pixels a GEMM row)"
    ctx.op_done(n, b, yq.shape, {"split": split})
