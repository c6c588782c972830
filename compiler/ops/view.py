"""Flatten and Reshape: new views of an activation's bytes (no program, no data moved) where the
layout allows it: any reshape of a dense tensor, and the flat view of an HWC tensor."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

from npu.tensors import Layout

from ..quantize import Act
from .registry import rule

if TYPE_CHECKING:
    from ..lower import Lowerer


def view_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    x = ctx.act_in(n.input[0], n)
    out = ctx.q_out(n.output[0], n)
    if (out.scale, out.zero_point) != (x.q.scale, x.q.zero_point):
        return "a reshape that changes quantisation"
    lay = x.layout
    if lay.kind == "dense" or tuple(out.shape) == tuple(lay.shape):
        return None
    if lay.kind == "hwc" and tuple(out.shape) == lay.flatten().shape:
        return None
    return "a reshape that moves data"


@rule("Flatten", "Reshape", check=view_check, view=True)
def lower_view(ctx: Lowerer, n: onnx.NodeProto) -> None:
    x = ctx.act_in(n.input[0], n)
    out = ctx.q_out(n.output[0], n)
    lay = x.layout
    if lay.kind == "dense":
        lay = Layout.dense(out.shape)
    elif tuple(out.shape) != tuple(lay.shape):
        lay = lay.flatten()
    ctx.acts[out.name] = Act(out, x.addr, lay)
    ctx.new_frag(n, "view", out.shape)
