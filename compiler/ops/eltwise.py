"""Element-wise operators on the vector unit: Relu and Clip (a requantising clamp), Add/Sum of two
activations (or a table function of one, `lut`), Concat along channels (a copy with per-input
rescale), and every other element-wise function of one activation through a table (`lut`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from npu.program import ProgramBuilder
from npu.tensors import Layout
from npu.timing import bank_stride

from ..elementwise import add_program, concat_program, eltwise_program
from ..graph import CompileError, node_attrs
from ..quantize import add_multipliers, requant_params
from . import lut
from .registry import rule

if TYPE_CHECKING:
    from ..lower import Lowerer


def _unit(lay: Layout) -> int:
    """The vector step an element-wise program may split at: a pixel's channels, or a row."""
    return lay.cp if lay.kind != "dense" else (lay.shape[-1] if lay.shape and lay.shape[-1] <= 4096 else 1)


def _clamp(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder, lo: float | None, hi: float | None) -> None:
    x = ctx.act_in(n.input[0], n)
    yq = ctx.q_out(n.output[0], n)
    y = ctx.place(yq, f"{ctx.where(n)} output", x.layout)
    params = requant_params(x.q, yq, ctx.where(n), lo, hi)
    eltwise_program(b, ctx.cfg, x.addr, y.addr, x.nbytes, params, _unit(x.layout), ctx.step)
    ctx.op_done(n, b, yq.shape)


@rule("Relu")
def lower_relu(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    _clamp(ctx, n, b, 0.0, None)


@rule("Clip")
def lower_clip(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    a = node_attrs(n)
    lo, hi = a.get("min"), a.get("max")
    for idx in (1, 2):
        if len(n.input) > idx and n.input[idx]:
            name = n.input[idx]
            if name in ctx.consts:
                v = float(ctx.consts[name].reshape(-1)[0])
            elif ctx.src_kind(name) == "const":
                s = ctx.dq_source(name, n)
                v = (float(s[1].reshape(-1)[0]) - s[3]) * float(np.asarray(s[2]).reshape(-1)[0])
            else:
                raise CompileError(f"{ctx.where(n)}: Clip bounds must be constants")
            lo, hi = (v, hi) if idx == 1 else (lo, v)
    _clamp(ctx, n, b, lo, hi)


def add_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    ins = [i for i in n.input if i]
    if len(ins) != 2 or any(ctx.src_kind(i) != "act" for i in ins):
        return "only the sum of two activations runs on the NPU"
    if ctx.act_in(ins[0], n).layout != ctx.act_in(ins[1], n).layout:
        return "operands of different shapes or layouts (broadcasting)"
    return None


def add_or_table_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    why = add_check(ctx, n)
    return None if why is None or lut.check(ctx, n) is None else why


@rule("Add", "Sum", check=add_or_table_check)
def lower_add(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    """The sum of two activations of one shape (VADD), else a function of one (a table)."""
    if add_check(ctx, n) is not None:
        lut.lower(ctx, n, b)
        return
    where = ctx.where(n)
    xa, xb = (ctx.act_in(i, n) for i in n.input if i)
    yq = ctx.q_out(n.output[0], n)
    y = ctx.place(yq, f"{where} output", xa.layout)
    ma, mb, shift = add_multipliers(xa.q.scale / yq.scale, xb.q.scale / yq.scale, where)
    params = dict(
        mult_a=ma, mult_b=mb, shift=shift, zp_a=xa.q.zero_point, zp_b=xb.q.zero_point, zp_out=yq.zero_point
    )
    add_program(b, ctx.cfg, xa.addr, xb.addr, y.addr, xa.nbytes, params, _unit(xa.layout), ctx.step)
    ctx.op_done(n, b, yq.shape)


def concat_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    ins = [ctx.act_in(i, n) for i in n.input]
    rank = len(ins[0].q.shape)
    if node_attrs(n).get("axis") not in (1, 1 - rank) or rank not in (2, 4):
        return "concatenation on an axis other than channels"
    return None


@rule("Concat", check=concat_check)
def lower_concat(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    xs = [ctx.act_in(i, n) for i in n.input]
    yq = ctx.q_out(n.output[0], n)
    parts, off, chan = [], 0, []
    for x in xs:
        rescale = None
        if (x.q.scale, x.q.zero_point) != (yq.scale, yq.zero_point):
            rescale = requant_params(x.q, yq, ctx.where(n))
        width = x.layout.cp if x.layout.kind == "hwc" else x.q.shape[1]
        if x.layout.kind == "hwc":
            chan.extend(off + c for c in x.layout.chan)
        parts.append((x, width, off, rescale))
        off += width
    if len(yq.shape) == 4:
        layout = Layout.hwc(yq.shape, ctx.ca, tuple(chan), bank_stride(ctx.cfg, off, ctx.ca))
        pixels = layout.pixels
    else:
        layout, pixels = Layout.dense(yq.shape), yq.shape[0]
    y = ctx.place(yq, f"{ctx.where(n)} output", layout)
    concat_program(b, ctx.cfg, parts, y, pixels, ctx.step)
    ctx.op_done(n, b, yq.shape)


rule(*sorted((lut.UNARY | lut.BINARY) - {"Relu", "Clip", "Identity", "Add"}), check=lut.check)(lut.lower)
