"""Element-wise operators on the vector unit: Relu and Clip (a requantising clamp), Add/Sum of two
activations (or a table function of one, `lut`), Concat along channels (a copy with per-input
rescale), Mul of two activations (VMUL: same shape, or a per-channel gate), and every other
element-wise function of one activation through a table (`lut`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import onnx

from npu.program import ProgramBuilder
from npu.tensors import Layout
from npu.timing import bank_stride

from ..elementwise import add_program, concat_program, eltwise_program, mul_program, step_unit
from ..graph import node_attrs
from ..quantize import add_multipliers, quant_multiplier, requant_params, rescale_params
from . import lut
from .registry import rule

if TYPE_CHECKING:
    from ..lower import Lowerer


def _clamp(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder, lo: float | None, hi: float | None) -> None:
    x = ctx.act_in(n.input[0], n)
    yq = ctx.q_out(n.output[0], n)
    y = ctx.place(yq, f"{ctx.where(n)} output", x.layout)
    params = requant_params(x.q, yq, ctx.where(n), lo, hi)
    unit = step_unit(x.layout)
    eltwise_program(b, ctx.cfg, x.addr, y.addr, x.nbytes, params, unit, ctx.step, x.layout.elem)
    ctx.op_done(n, b, yq.shape)


def same_type_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    if ctx.act_in(n.input[0], n).q.elem != ctx.q_out(n.output[0], n).elem:
        return "from an int8 to an int16 tensor or back"
    return None


@rule("Relu", check=same_type_check, int16=True)
def lower_relu(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    _clamp(ctx, n, b, 0.0, None)


@rule("Clip", check=same_type_check, int16=True)
def lower_clip(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    _clamp(ctx, n, b, *ctx.clip_bounds(n))


def add_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    ins = [i for i in n.input if i]
    if len(ins) != 2 or any(ctx.src_kind(i) != "act" for i in ins):
        return "only the sum of two activations runs on the NPU"
    if ctx.act_in(ins[0], n).layout != ctx.act_in(ins[1], n).layout:
        return "operands of different shapes or layouts (broadcasting)"
    if ctx.act_in(ins[0], n).q.elem != ctx.q_out(n.output[0], n).elem:
        return "an int8 and an int16 tensor"
    return None


def add_or_table_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    why = add_check(ctx, n)
    return None if why is None or lut.check(ctx, n) is None else why


@rule("Add", "Sum", check=add_or_table_check, int16=True)
def lower_add(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    """The sum of two activations of one shape (VADD), else a function of one (a table)."""
    if add_check(ctx, n) is not None:
        lut.lower(ctx, n, b)
        return
    where = ctx.where(n)
    xa, xb = (ctx.act_in(i, n) for i in n.input if i)
    yq, lo = ctx.q_out(n.output[0], n), -128
    if (relu_q := ctx.fuse_relu(n.output[0])) is not None:  # a residual's Relu: the sum clamped at 0
        yq, lo = relu_q, 0 if relu_q.wide else relu_q.zero_point
    y = ctx.place(yq, f"{where} output", xa.layout)
    ma, mb, shift = add_multipliers(xa.q.scale / yq.scale, xb.q.scale / yq.scale, where)
    params = dict(
        mult_a=ma, mult_b=mb, shift=shift, zp_a=xa.q.zero_point, zp_b=xb.q.zero_point, zp_out=yq.zero_point,
        lo=lo,
    )  # fmt: skip
    e = xa.layout.elem
    add_program(b, ctx.cfg, xa.addr, xb.addr, y.addr, xa.nbytes, params, step_unit(xa.layout), ctx.step, e)
    ctx.op_done(n, b, yq.shape)


def _mul_operands(ctx: Lowerer, n: onnx.NodeProto):
    """(a, b, row, pad_runs) of a product of two activations the vector unit runs, else why not:
    the same layout (row 0), or b one value per channel of a (a gate: [1, C, 1, 1] against
    [1, C, H, W], or [1, C] against [R, C]), multiplied into each pixel's first `row` bytes."""
    ins = [i for i in n.input if i]
    if len(ins) != 2 or any(ctx.src_kind(i) != "act" for i in ins):
        return "only a product of two activations (or a function of one) runs on the NPU"
    xa, xb = (ctx.act_in(i, n) for i in ins)
    if not xa.q.elem == xb.q.elem == ctx.q_out(n.output[0], n).elem:
        return "a product of int8 and int16 tensors"
    if xa.layout == xb.layout:
        return xa, xb, 0, ()
    if xa.nbytes < xb.nbytes:
        xa, xb = xb, xa
    la, lb = xa.layout, xb.layout
    sa, sb = xa.q.shape, xb.q.shape
    if la.kind == "hwc" and len(sb) == 4 and sb[0] == sa[0] == 1 and sb[1] == sa[1] and sb[2:] == (1, 1):
        if lb.kind == "hwc" and lb.cp == la.cp and lb.chan == la.chan:
            return xa, xb, la.cp, ()
        c = sa[1]
        if lb.kind == "dense" and la.chan == tuple(range(c)):
            return xa, xb, c, ((c, la.cp - c),) if la.cp > c else ()
    if la.kind == lb.kind == "dense" and len(sa) == len(sb) == 2 and sb == (1, sa[1]):
        return xa, xb, sa[1], ()
    return f"a product of shapes {list(sa)} and {list(sb)} that is not a per-channel gate"


def mul_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    if lut.check(ctx, n) is None:
        return None
    r = _mul_operands(ctx, n)
    return r if isinstance(r, str) else None


@rule("Mul", check=mul_check, int16=True)
def lower_mul(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    """A function of one activation (a table, `lut`), else a product of two (VMUL)."""
    if lut.check(ctx, n) is None:
        lut.lower(ctx, n, b)
        return
    xa, xb, row, pad_runs = _mul_operands(ctx, n)
    yq = ctx.q_out(n.output[0], n)
    y = ctx.place(yq, f"{ctx.where(n)} output", xa.layout)
    mult, shift = quant_multiplier(xa.q.scale * xb.q.scale / yq.scale, ctx.where(n))
    params = dict(mult=mult, shift=shift, zp_a=xa.q.zero_point, zp_b=xb.q.zero_point, zp_out=yq.zero_point)
    e = xa.layout.elem
    if not row:
        unit = step_unit(xa.layout)
    else:
        unit = (xa.layout.cp if xa.layout.kind == "hwc" else row) * e
    mul_program(b, ctx.cfg, xa.addr, xb.addr, y.addr, xa.nbytes, params, unit, row, pad_runs, ctx.step, e)
    ctx.op_done(n, b, yq.shape)


def concat_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    ins = [ctx.act_in(i, n) for i in n.input]
    rank = len(ins[0].q.shape)
    if len({x.q.elem for x in ins} | {ctx.q_out(n.output[0], n).elem}) > 1:
        return "a concatenation of int8 and int16 tensors"
    if all(x.layout.kind == "dense" for x in ins):
        return None  # any axis: rows of the axes before it, each input a block of every row
    if node_attrs(n).get("axis") not in (1, 1 - rank) or rank not in (2, 4):
        return "concatenation on an axis other than channels"
    if any(x.layout.kind not in ("dense", "hwc") for x in ins):
        return "a concatenation of tensors laid out as " + ", ".join(sorted({x.layout.kind for x in ins}))
    return None


@rule("Concat", check=concat_check, int16=True)
def lower_concat(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    xs = [ctx.act_in(i, n) for i in n.input]
    yq = ctx.q_out(n.output[0], n)
    if all(x.layout.kind == "dense" for x in xs):
        _concat_dense(ctx, n, b, xs, yq)
        return
    parts, off, chan = [], 0, []
    e = yq.elem
    for x in xs:
        rescale = rescale_params(x.q, yq, ctx.where(n))
        width = x.layout.cp if x.layout.kind == "hwc" else x.q.shape[1]
        if x.layout.kind == "hwc":
            chan.extend(off + c for c in x.layout.chan)
        parts.append((x, width * e, off * e, rescale))
        off += width
    if len(yq.shape) == 4:
        layout = Layout.hwc(yq.shape, ctx.ca, tuple(chan), bank_stride(ctx.cfg, off, ctx.ca, elem=e), e)
        pixels = layout.pixels
    else:
        layout, pixels = Layout.dense(yq.shape, e), yq.shape[0]
    y = ctx.place(yq, f"{ctx.where(n)} output", layout)
    concat_program(b, ctx.cfg, parts, y, pixels, ctx.step)
    ctx.op_done(n, b, yq.shape)


_OWN = {"Relu", "Clip", "Identity", "Add", "Mul"}  # rules above (or cleanup's) that try a table themselves
rule(*sorted((lut.UNARY | lut.BINARY) - _OWN), check=lut.check, int16=True)(lut.lower)


def _concat_dense(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder, xs: list, yq) -> None:
    """Dense tensors joined on any axis: the output's rows are the axes before it, and each input
    is a block of every row (a recurrent layer's steps joined into its sequence, heads joined)."""
    rank = len(yq.shape)
    axis = node_attrs(n).get("axis", 0) % rank
    rows, e = math.prod(yq.shape[:axis]), yq.elem
    parts, off = [], 0
    for x in xs:
        width = math.prod(x.q.shape[axis:])
        parts.append((x, width * e, off * e, rescale_params(x.q, yq, ctx.where(n))))
        off += width
    y = ctx.place(yq, f"{ctx.where(n)} output", Layout.dense(yq.shape, e))
    concat_program(b, ctx.cfg, parts, y, rows, ctx.step, out_w=off * e)
    ctx.op_done(n, b, yq.shape)
