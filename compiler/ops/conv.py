"""Conv: 2-D convolution (strides, padding, dilation, groups, depthwise) as per-tap MATMULs over row bands,
split by frame, output channel, input channel or height to fit the scratchpad (compiler/spatial.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from npu.program import ProgramBuilder

from ..elementwise import OutputPass, ResidualAdd
from ..graph import CompileError, node_attrs
from ..quantize import QTensor, add_multipliers, channel_requant
from ..spatial import conv_program, geometry
from . import lut
from .registry import placement, rule

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
        # the Add reading the result (a residual) on each band before the store - not after a
        # function's passes: the longer tail of each band's output pass, drained at every
        # cancellation point, cost more than the Add's own pass (docs/compiler.md, "Residual Adds")
        res = residual_add(ctx, stored) if post is None else None
        if res is not None:
            add, r, stored, other, made = res
            post = OutputPass(None, None, 0, False, "", lut=False, residual=r)
            ctx.fused[add.name] = n.name
            deps = [*n.input, other]
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
        fold=ctx.im2col,
    )
    if post is not None and post.lut:  # (the function's view fragment follows: its readers wait for it)
        info["split"] += f"; then {t.op_type} {t.name} on each band ({post.how})"
    if post is not None and post.residual is not None:  # it reads the Add's other operand too
        info["split"] += f"; then Add {post.residual.name} on each band (VADD)"
        # and it makes the Add's output (and its Relu's): a reader lowered before the Add's own
        # node (the next residual's convolution) depends on this fragment
        n = onnx.helper.make_node(n.op_type, deps, [*n.output, *made], name=n.name)
    ctx.op_done(n, b, y.q.shape, info)


def residual_add(
    ctx: Lowerer, q: QTensor
) -> tuple[onnx.NodeProto, ResidualAdd, QTensor, str, list[str]] | None:
    """The Add of two activations that alone reads `q` (a convolution's result as it would be
    stored), on the NPU, whose other operand is computed already in the layout `q` would have: the
    Add, the residual step for the output pass, the Add's output (what is stored instead), the
    other operand's name and the tensors the convolution now makes (the Add's, its Relu's); else
    None."""
    lut.plan(ctx)
    readers = ctx._lut_readers.get(q.name, [])
    if len(readers) != 1 or readers[0].op_type not in ("Add", "Sum") or not readers[0].name:
        return None
    add = readers[0]
    ins = [i for i in add.input if i]
    if len(ins) != 2 or add.name in ctx.reasons or placement(ctx, add, rule_check=False) is not None:
        return None
    if ctx._trace(ins[0]) == ctx._trace(ins[1]):
        return None  # x + x: the same tile twice
    if any(ctx.src_kind(i) != "act" for i in ins):
        return None
    first = ctx.graph.producers[ins[0]].input[0] == q.name
    other = ins[1] if first else ins[0]
    src = ctx.graph.producers[other].input[0]
    if src not in ctx.acts:
        return None  # computed later (or on the host)
    xo = ctx.acts[src]
    if xo.layout != ctx.default_layout(q) or xo.q.elem != q.elem:
        return None
    yq, lo = ctx.q_out(add.output[0], add), -128
    if yq.elem != q.elem:
        return None
    made = [add.output[0]]
    if (relu_q := ctx.fuse_relu(add.output[0])) is not None:  # a residual's Relu: the sum clamped at 0
        yq, lo = relu_q, 0 if relu_q.wide else relu_q.zero_point
        made.append(ctx.fusable_relu(add.output[0])[0].output[0])
    qa, qb = (q, xo.q) if first else (xo.q, q)
    ma, mb, shift = add_multipliers(qa.scale / yq.scale, qb.scale / yq.scale, ctx.where(add))
    params = dict(mult_a=ma, mult_b=mb, shift=shift, zp_a=qa.zero_point, zp_b=qb.zero_point,
                  zp_out=yq.zero_point, lo=lo)  # fmt: skip
    return add, ResidualAdd(xo.addr, params, q.elem, first, add.name), yq, other, made
