"""Resize by integer factors with nearest-neighbour sampling (a feature pyramid's 2x upsampling) as a
DMA program: each band of input rows is loaded once (and rescaled in place by a VMAP when the output
is quantised differently), then every row is stored `fh x fw` times, `fw` pixels apart.

Whether a node samples that way is not read from its attributes: the node itself is evaluated
(`onnx.reference`) on a tensor of source indices, so every coordinate transformation and rounding
mode that amounts to `source = output // factor` is covered and nothing else is."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from npu.arith import round_up
from npu.program import ProgramBuilder
from npu.tensors import Layout

from ..graph import CompileError
from ..quantize import rescale_params
from ..spatial import spad_regions
from .registry import rule

if TYPE_CHECKING:
    from ..lower import Lowerer


def _factors(ctx: Lowerer, n: onnx.NodeProto) -> tuple[int, int] | str:
    """(fh, fw), or why this Resize is not a nearest-neighbour upsampling by integer factors."""
    where = ctx.where(n)
    x, y = ctx.shape(n.input[0], n), ctx.shape(n.output[0], n)
    if len(x) != 4 or len(y) != 4 or x[:2] != y[:2]:
        return "a resize of the batch or channel dimension"
    (h, w), (oh, ow) = x[2:], y[2:]
    if oh % h or ow % w:
        return f"a resize from {h}x{w} to {oh}x{ow} (not integer factors)"
    fh, fw = oh // h, ow // w
    extra = [i for i in n.input[1:] if i]
    if any(i not in ctx.consts for i in extra):
        return "a resize whose scales or sizes are computed at run time"
    inits = [numpy_helper.from_array(ctx.consts[i], i) for i in extra]
    sizes = n.input[3] if len(n.input) > 3 and n.input[3] else ""
    if sizes:  # sizes of a one-channel probe
        inits = [t if t.name != sizes else numpy_helper.from_array(np.array([1, 1, oh, ow], np.int64), sizes)
                 for t in inits]  # fmt: skip
    probe = helper.make_node(n.op_type, ["x", *n.input[1:]], ["y"], domain=n.domain, **{
        a.name: helper.get_attribute_value(a) for a in n.attribute})  # fmt: skip
    g = helper.make_graph(
        [probe], "probe", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, h, w])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    try:
        idx = np.arange(h * w, dtype=np.float32).reshape(1, 1, h, w)
        model = helper.make_model(g, opset_imports=list(ctx.graph.model.opset_import))
        got = np.asarray(ReferenceEvaluator(model).run(None, {"x": idx})[0])
    except Exception as e:  # an attribute combination the reference does not run
        raise CompileError(f"{where}: cannot evaluate the Resize ({e})") from None
    want = (np.arange(oh) // fh)[:, None] * w + (np.arange(ow) // fw)[None, :]
    if got.shape != (1, 1, oh, ow) or not np.array_equal(got[0, 0], want):
        return "a resize that does not copy each pixel to a factor x factor block (bilinear, or shifted)"
    return fh, fw


def resize_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    r = _factors(ctx, n)
    if isinstance(r, str):
        return r
    x = ctx.act_in(n.input[0], n)
    if x.layout.kind != "hwc" or x.layout.nchw[3] * x.layout.cp * x.layout.elem > 0xFFFF:
        return "a resize of rows longer than one DMA row"
    if x.q.elem != ctx.q_out(n.output[0], n).elem:
        return "a resize from int8 to int16 or back"
    return None


@rule("Resize", check=resize_check, int16=True)
def lower_resize(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    where = ctx.where(n)
    fh, fw = _factors(ctx, n)
    x = ctx.act_in(n.input[0], n)
    yq = ctx.q_out(n.output[0], n)
    lay = x.layout
    y = ctx.place(yq, f"{where} output", Layout.hwc(yq.shape, ctx.ca, lay.chan, lay.cp, lay.elem))
    bn, _, h, w = lay.nchw
    e = lay.elem
    flags = {"src_i16": 1, "dst_i16": 1} if e == 2 else {}
    cp, row = lay.cp * e, lay.nchw[3] * lay.cp * e  # bytes of a pixel and of a row
    rescale = rescale_params(x.q, yq, where)
    rows = max(1, min(h, spad_regions(ctx.cfg)[0] // 2 // round_up(row, ctx.cfg.lanes)))
    if rows * row > spad_regions(ctx.cfg)[0] // 2:
        raise CompileError(f"{where}: one input row ({row} bytes) does not fit half the scratchpad")
    bufs = [0, round_up(rows * row, ctx.cfg.lanes)]
    k = 0
    for f in range(bn):
        for y0 in range(0, h, rows):
            rr = min(rows, h - y0)
            buf = bufs[k % 2]
            k += 1
            src = x.addr + (f * h + y0) * row
            b.add("load", spad=buf, dram=src, rows=rr, cols=row, spad_stride=row, dram_stride=row)
            if rescale is not None:
                b.add("vmap", src=buf, dst=buf, rows=rr, cols=row // e, src_stride=row, dst_stride=row,
                      **rescale, **flags)  # fmt: skip
            for i in range(rr):
                for dy in range(fh):
                    out = y.addr + ((f * h + y0 + i) * fh + dy) * w * fw * cp
                    for dx in range(fw):
                        b.add("store", spad=buf + i * row, dram=out + dx * cp, rows=w, cols=cp,
                              spad_stride=cp, dram_stride=fw * cp)  # fmt: skip
            b.candidate()
    split = f"height x{-(-h // rows)}" if rows < h else "none"
    ctx.op_done(n, b, yq.shape, {"split": split, "spad_bytes": 2 * rows * row})
