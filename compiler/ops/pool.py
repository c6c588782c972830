"""Pooling: MaxPool, AveragePool (padding counted) and GlobalAveragePool on the vector unit, split by
frame, channel or height (compiler/spatial.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

from npu.program import ProgramBuilder
from npu.tensors import Layout

from ..graph import CompileError, node_attrs
from ..quantize import quant_multiplier, rescale_params
from ..spatial import geometry, global_pool_program, pool_program
from .registry import rule

if TYPE_CHECKING:
    from ..lower import Lowerer


def pool_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    a = node_attrs(n)
    if len(ctx.shape(n.input[0], n)) != 4:
        return "a 1-D or 3-D pooling (the NPU's are 2-D)"
    if a.get("ceil_mode", 0) or any(d != 1 for d in a.get("dilations", [1, 1])):
        return "ceil_mode or dilation"
    if n.op_type == "AveragePool" and any(a.get("pads", [0])) and not a.get("count_include_pad", 0):
        return "average pooling that excludes padding"
    if ctx.act_in(n.input[0], n).q.elem != ctx.q_out(n.output[0], n).elem:
        return "pooling from int8 to int16 or back"
    return None


def _pool(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder, kernel, strides, pads, mode: int) -> None:
    where = ctx.where(n)
    x = ctx.act_in(n.input[0], n)
    if x.layout.kind != "hwc":
        raise CompileError(f"{where}: pooling needs a 4-D NCHW input")
    yq = ctx.q_out(n.output[0], n)
    y = ctx.place(yq, f"{where} output", Layout.hwc(yq.shape, ctx.ca, x.layout.chan, x.layout.cp, yq.elem))
    geo = geometry(x, y, kernel, strides, pads, where)
    rescale = None
    if mode == 0:
        rq = dict(mult=1, shift=0, zp_in=0, zp_out=0, lo=-128, hi=127)
        rescale = rescale_params(x.q, yq, where)
    else:
        mult, shift = quant_multiplier(x.q.scale / (yq.scale * kernel[0] * kernel[1]), where)
        rq = dict(mult=mult, shift=shift, zp_in=x.q.zero_point, zp_out=yq.zero_point, lo=-128, hi=127)
    info = pool_program(b, ctx.cfg, x, y, geo, mode, rq, rescale, where, ctx.step)
    ctx.op_done(n, b, yq.shape, info)


@rule("MaxPool", "AveragePool", check=pool_check, int16=True)
def lower_pool(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    a = node_attrs(n)
    mode = 0 if n.op_type == "MaxPool" else 1
    _pool(ctx, n, b, a["kernel_shape"], a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0]), mode)


@rule("GlobalAveragePool", check=pool_check, int16=True)
def lower_global_average_pool(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    x = ctx.act_in(n.input[0], n)
    _, _, h, w = x.q.shape
    try:
        _pool(ctx, n, b, [h, w], [1, 1], [0, 0, 0, 0], 1)
        return
    except CompileError:  # the whole height does not fit at once (or exceeds a window): row bands
        if x.layout.kind != "hwc" or w > 255:
            raise
    where = ctx.where(n)
    yq = ctx.q_out(n.output[0], n)
    y = ctx.acts.get(yq.name) or ctx.place(
        yq, f"{where} output", Layout.hwc(yq.shape, ctx.ca, x.layout.chan, x.layout.cp, yq.elem)
    )
    info = global_pool_program(b, ctx.cfg, x, y, where)
    ctx.op_done(n, b, yq.shape, info)
