"""Conv: 2-D convolution (strides, padding, dilation, groups, depthwise) as per-tap MATMULs over row bands,
split by frame, output channel, input channel or height to fit the scratchpad (compiler/spatial.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from npu.program import ProgramBuilder

from ..graph import CompileError, node_attrs
from ..quantize import channel_requant
from ..spatial import conv_program, geometry
from . import lut
from .registry import rule

if TYPE_CHECKING:
    from ..lower import Lowerer


def conv_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    """The NPU convolves 2-D maps by constant weights; 1-D and 3-D convolutions, and weights
    computed at run time, run on the host."""
    if ctx.src_kind(n.input[1]) != "const":
        return "weights computed at run time"
    w = ctx.dq_source(n.input[1], n)[1]
    if w.ndim != 4 or len(ctx.shape(n.input[0], n)) != 4:
        return f"a {w.ndim - 2}-D convolution (the NPU's are 2-D)"
    return None


@rule("Conv", check=conv_check, int16=True)
def lower_conv(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    where = ctx.where(n)
    a = node_attrs(n)
    x = ctx.act_in(n.input[0], n)
    w, s_w = ctx.weights(n.input[1], n)
    if w.ndim != 4 or x.layout.kind != "hwc":
        raise CompileError(f"{where}: only 2-D convolutions (NCHW) are supported")
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise CompileError(f"{where}: auto_pad is not supported; give explicit pads")
    groups = a.get("group", 1)
    cout, cin_g, kh, kw = w.shape
    if cin_g * groups != x.q.shape[1] or cout % groups:
        raise CompileError(
            f"{where}: weights {w.shape} do not match {x.q.shape[1]} channels, {groups} groups"
        )
    bias = ctx.bias(n, 2, cout, x, s_w) - x.q.zero_point * w.astype(np.int64).sum(axis=(1, 2, 3))
    if np.abs(bias).max(initial=0) >= 2**31:
        raise CompileError(f"{where}: folded bias overflows int32")
    post = None
    if ctx.wide_output(n.output[0]):  # the accumulators themselves are the result (compiler/outputs.py)
        shape = ctx.shape(n.output[0], n)
        y = ctx.place_wide(n.output[0], shape, x.q.scale * np.asarray(s_w, np.float64), f"{where} output")
        plan_cfg, rq = ctx.cfg, None
    else:
        yq, lo = ctx.q_out(n.output[0], n), -128
        if (relu_q := ctx.fuse_relu(n.output[0])) is not None:
            # straight to the Relu's output, clamped at zero (int16: the high byte's bound)
            yq, lo = relu_q, 0 if relu_q.wide else relu_q.zero_point
        stored = yq
        if relu_q is None and (t := ctx.output_tables.get(n.name)) is not None:
            # the activation function after it, on each band before the store (the function's
            # node lowers as a view): its vector passes run under the next band's MATMULs
            post, stored = lut.output_pass(ctx, t)
            ctx.fused[t.name] = n.name
        y = ctx.place(stored, f"{where} output")
        plan_cfg, rq = ctx.per_column(b, channel_requant(x.q, s_w, yq, where, lo), where)
    dil = a.get("dilations", [1, 1])
    geo = geometry(x, y, (kh, kw), a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0]), where, dil)
    info = conv_program(
        b,
        plan_cfg,
        x,
        y,
        w,
        bias,
        groups,
        geo,
        rq,
        ctx.const,
        where,
        ctx.step,
        ctx.max_live,
        post,
        narrow=ctx.narrow_depthwise,
    )
    if post is not None:  # (the function's view fragment follows this one: its readers wait for it)
        info["split"] += f"; then {t.op_type} {t.name} on each band ({post.how})"
    ctx.op_done(n, b, y.q.shape, info)
