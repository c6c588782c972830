"""Split along channels (YOLOv8's C2f blocks, channel groups): each output is a DMA copy of its
channels out of every input pixel into a tensor of its own (padding channels at the zero point),
rescaled in place by a VMAP when the output is quantised differently."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

from npu.arith import round_up
from npu.program import ProgramBuilder
from npu.tensors import Layout
from npu.timing import bank_stride

from ..graph import node_attrs
from ..quantize import rescale_params
from .registry import rule

if TYPE_CHECKING:
    from ..lower import Lowerer


def _slices(ctx: Lowerer, n: onnx.NodeProto) -> list[tuple[int, int]] | str:
    """(first physical channel, channels) of each output, or why the NPU does not run this Split."""
    x = ctx.act_in(n.input[0], n)
    axis = node_attrs(n).get("axis", 0)
    if x.layout.kind != "hwc" or axis not in (1, -3):
        return "a split on an axis other than channels"
    if not all(o and ctx.quantised(o) for o in n.output):
        return "a split with an output that is not quantised"
    if any(ctx.q_out(o, n).elem != x.q.elem for o in n.output):
        return "a split from int8 to int16 or back"
    out, c0 = [], 0
    for o in n.output:
        c = ctx.shape(o, n)[1]
        phys = x.layout.chan[c0 : c0 + c]
        if list(phys) != list(range(phys[0], phys[0] + c)):
            return "a split of channels that are not contiguous in memory"
        out.append((phys[0], c))
        c0 += c
    return out


def split_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    r = _slices(ctx, n)
    return r if isinstance(r, str) else None


@rule("Split", check=split_check, int16=True)
def lower_split(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    where = ctx.where(n)
    x = ctx.act_in(n.input[0], n)
    e = x.layout.elem  # int16: every byte count doubles (zero point 0: padding bytes are zero)
    flags = {"src_i16": 1, "dst_i16": 1} if e == 2 else {}
    cp_in, pixels = x.layout.cp * e, x.layout.pixels
    half = ctx.cfg.spad_bytes // 2
    k = 0
    for o, (p0, c) in zip(n.output, _slices(ctx, n), strict=True):
        yq = ctx.q_out(o, n)
        cpe = bank_stride(ctx.cfg, round_up(c, ctx.ca), ctx.ca, elem=e)
        y = ctx.place(yq, f"{where} output {o}", Layout.hwc(yq.shape, ctx.ca, cp=cpe, elem=e))
        cp = cpe * e
        rescale = rescale_params(x.q, yq, where)
        per = max(1, min(0xFFFF, half // cp))
        for q0 in range(0, pixels, per):
            pc = min(per, pixels - q0)
            buf = (k % 2) * half
            k += 1
            b.add("load", spad=buf, dram=x.addr + q0 * cp_in + p0 * e, rows=pc, cols=c * e, spad_stride=cp,
                  dram_stride=cp_in, pad_right=cp - c * e, pad_value=x.q.zero_point)  # fmt: skip
            if rescale is not None:
                b.add("vmap", src=buf, dst=buf, rows=pc, cols=cpe, src_stride=cp, dst_stride=cp, **rescale,
                      **flags)  # fmt: skip
            b.add("store", spad=buf, dram=y.addr + q0 * cp, rows=pc, cols=cp, spad_stride=cp, dram_stride=cp)
            b.candidate()
    ctx.op_done(n, b, ctx.shape(n.output[0], n))
