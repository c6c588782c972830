"""Flatten, Reshape and Gather of channels: new views of an activation's bytes (no program, no data
moved) where the layout allows it: any reshape of a dense tensor, the flat view of an HWC tensor,
the sequence view of an HWC map of height 1,
and an HWC tensor's channels selected or permuted (its channel map, `Layout.chan`). A reshape of a
dense tensor whose output is quantised differently (the quantiser folds a following Relu into it)
is one requantising VMAP over its bytes."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import onnx

from npu.program import ProgramBuilder
from npu.tensors import Layout

from ..elementwise import eltwise_program, step_unit
from ..graph import node_attrs
from ..quantize import Act, requant_params
from .registry import rule

if TYPE_CHECKING:
    from ..lower import Lowerer


def view_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    x = ctx.act_in(n.input[0], n)
    out = ctx.q_out(n.output[0], n)
    lay = x.layout
    if out.elem != x.q.elem:
        return "a reshape from int8 to int16 or back"
    if lay.kind == "dense" and len(out.shape) == 4 and _feeds_maps(ctx, n.output[0]):
        return "a reshape of a dense tensor into a feature map (the NPU keeps maps HWC)"
    if (out.scale, out.zero_point) != (x.q.scale, x.q.zero_point):
        # a dense tensor's bytes in order, requantised (a Relu the quantiser folded into the
        # reshape's output range): one VMAP over them
        return None if lay.kind == "dense" else "a reshape that changes quantisation of a tensor not dense"
    if lay.kind == "dense" or tuple(out.shape) == tuple(lay.shape):
        return None
    if lay.kind == "hwc" and tuple(out.shape) == lay.flatten().shape:
        return None
    if lay.kind == "hwc" and lay.nchw[2] == 1 and tuple(out.shape) == lay.squeeze_height().shape:
        return None  # a map of height 1 back to its sequence (compiler/lift1d.py)
    return "a reshape that moves data"


#: operators that read an NCHW map in the NPU's HWC layout
MAP_READERS = {
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Resize",
}


def _feeds_maps(ctx: Lowerer, name: str) -> bool:
    """Whether `name` (through its QuantizeLinear/DequantizeLinear pair) feeds a map reader."""
    for c in ctx.graph.consumers.get(name, []):
        if c.op_type in ("QuantizeLinear", "DequantizeLinear"):
            if _feeds_maps(ctx, c.output[0]):
                return True
        elif c.op_type in MAP_READERS:
            return True
    return False


@rule("Flatten", "Reshape", check=view_check, view=True, int16=True)
def lower_view(ctx: Lowerer, n: onnx.NodeProto) -> None:
    x = ctx.act_in(n.input[0], n)
    out = ctx.q_out(n.output[0], n)
    if (out.scale, out.zero_point) != (x.q.scale, x.q.zero_point):  # dense (view_check): requantise
        where = ctx.where(n)
        y = ctx.place(out, f"{where} output", Layout.dense(out.shape, out.elem))
        b = ProgramBuilder(ctx.cfg)
        params = requant_params(x.q, out, where, None, None)
        eltwise_program(b, ctx.cfg, x.addr, y.addr, x.nbytes, params, step_unit(x.layout), ctx.step, out.elem)
        ctx.op_done(n, b, out.shape)
        return
    lay = x.layout
    if lay.kind == "dense":
        lay = Layout.dense(out.shape, lay.elem)
    elif tuple(out.shape) == lay.flatten().shape:
        lay = lay.flatten()
    elif tuple(out.shape) != tuple(lay.shape):
        lay = lay.squeeze_height()
    ctx.acts[out.name] = Act(out, x.addr, lay)
    ctx.new_frag(n, "view", out.shape)


def _block(ctx: Lowerer, n: onnx.NodeProto) -> int | None:
    """The byte offset of a Gather that takes one index of a dense tensor's first axis longer than
    1 (a recurrent layer's time step): a contiguous block, so a view; None otherwise."""
    x = ctx.act_in(n.input[0], n)
    idx = ctx.consts.get(n.input[1])
    shape = x.q.shape
    axis = node_attrs(n).get("axis", 0) % len(shape)
    if x.layout.kind != "dense" or idx is None or idx.size != 1 or math.prod(shape[:axis]) != 1:
        return None
    i = int(idx.reshape(-1)[0]) % shape[axis]
    return i * math.prod(shape[axis + 1 :]) * x.layout.elem


def gather_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    """A Gather of channels with constant, distinct indices is a view: the same bytes with the
    channels mapped anew (channel shuffles and channel slices, compiler/cleanup.py); so is one index
    of a dense tensor's leading axis (`_block`)."""
    axis = node_attrs(n).get("axis", 0)
    idx = ctx.consts.get(n.input[1])
    if _block(ctx, n) is not None:
        x, out = ctx.act_in(n.input[0], n), ctx.q_out(n.output[0], n)
        same = (out.scale, out.zero_point, out.elem) == (x.q.scale, x.q.zero_point, x.q.elem)
        return None if same else "a gather that changes quantisation"
    if idx is None or idx.ndim != 1 or axis not in (1, -3) or len(set(idx.tolist())) != idx.size:
        return "a gather other than of channels by constant, distinct indices"
    x = ctx.act_in(n.input[0], n)
    out = ctx.q_out(n.output[0], n)
    same = (out.scale, out.zero_point, out.elem) == (x.q.scale, x.q.zero_point, x.q.elem)
    if x.layout.kind != "hwc" or not same:
        return "a gather of channels that changes quantisation, or of a tensor that is not NCHW"
    return None


@rule("Gather", check=gather_check, view=True, int16=True)
def lower_gather(ctx: Lowerer, n: onnx.NodeProto) -> None:
    x = ctx.act_in(n.input[0], n)
    out = ctx.q_out(n.output[0], n)
    off = _block(ctx, n)
    if off is not None:
        ctx.acts[out.name] = Act(out, x.addr + off, Layout.dense(out.shape, x.layout.elem))
        ctx.new_frag(n, "view", out.shape)
        return
    c = x.q.shape[1]
    chan = tuple(x.layout.chan[int(i) % c] for i in ctx.consts[n.input[1]])
    ctx.acts[out.name] = Act(out, x.addr, Layout.hwc(out.shape, ctx.ca, chan, x.layout.cp, x.layout.elem))
    ctx.new_frag(n, "view", out.shape)
