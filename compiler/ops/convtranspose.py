"""ConvTranspose whose stride equals its kernel (a segmentation head's 2x upsampling): every output
pixel gets exactly one tap, so for each input row and kernel row `dy` it is one GEMM of the row's
pixels (m = W, k = input channels) by that kernel row's taps (n = kw x output channels), stored
straight into output row `y * kh + dy` (pixel x's kw taps are its kw neighbouring output pixels)."""

from __future__ import annotations

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
    cp = bank_stride(ctx.cfg, round_up(cout, ctx.ca), ctx.ca)
    e = x.layout.elem  # int16 activations: 2 bytes an element, in and out
    y = ctx.place(yq, f"{where} output", Layout.hwc(yq.shape, ctx.ca, cp=cp, elem=e))
    s_cols = np.tile(np.concatenate([s_w, np.full(cp - cout, s_w[0])]), kw)  # column dx * cp + co
    cfg, rq = ctx.per_column(b, channel_requant(x.q, s_cols, yq, where), where)
    nn = kw * cp
    try:
        tiling = choose_tiling(cfg, wd, nn, cp_in, e, e)
    except ValueError:
        raise CompileError(f"{where}: no GEMM tiling of {wd}x{nn}x{cp_in} fits {memory_name(cfg)}") from None
    chan = np.asarray(x.layout.chan)
    taps = []  # per kernel row: B^T (kw * cp, cp_in) and its bias with the input zero point folded
    for dy in range(kh):
        bt = np.zeros((nn, cp_in), np.int8)
        fb = np.zeros(nn, np.int64)
        for dx in range(kw):
            tap = w[:, :, dy, dx].astype(np.int64)  # (Cin, Cout)
            bt[dx * cp : dx * cp + cout][:, chan] = tap.T
            fb[dx * cp : dx * cp + cout] = bias - x.q.zero_point * tap.sum(axis=0)
        if np.abs(fb).max(initial=0) >= 2**31:
            raise CompileError(f"{where}: folded bias overflows int32")
        taps.append((ctx.const(bt.tobytes(), f"{where} weights row {dy}"),
                     ctx.const(fb.astype("<i4").tobytes(), f"{where} bias row {dy}")))  # fmt: skip
    for f in range(bn):
        for yy in range(h):
            a_addr = x.addr + (f * h + yy) * wd * cp_in * e
            for dy, (bt_addr, bias_addr) in enumerate(taps):
                c_addr = y.addr + ((f * h + yy) * kh + dy) * wd * kw * cp * e
                gemm_program(cfg, wd, nn, cp_in, a_addr, bt_addr, c_addr, mult=rq["mult"], shift=rq["shift"],
                             zp_out=yq.zero_point, bias_addr=bias_addr, tiling=tiling, builder=b,
                             per_col=rq.get("per_col"), relu=relu, ea=e, ey=e)  # fmt: skip
            b.candidate()
    ctx.op_done(n, b, yq.shape, {"split": f"rows x{bn * h}, kernel rows x{kh}"})
