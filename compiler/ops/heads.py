"""Attention's data movement and products on the NPU: Transpose, and MatMul of two activations.

* **Transpose** of a dense tensor is a view (layout `perm`, no data moved) when only MatMuls of two
  activations read it (the heads of Q, K and V: they address each head's rows through the strides);
  otherwise, when it keeps the last axis, a DMA copy of whole rows (the heads joined again after
  the product); else it runs on the host.
* **MatMul of two activations** (Q K^T, P V) is one GEMM per leading index (per head). The
  MATMUL instruction has no zero points and an int8 B^T, so the quantiser makes both operands
  symmetric and the second one int8 (`quantize.matmul_operands`). B^T's rows are K's rows when the
  second operand is a transposed view whose last two axes swap contiguous rows (K^T); otherwise
  each B^T row is a column of B, loaded one byte a DMA row (V).
"""

from __future__ import annotations

import math
from itertools import product
from typing import TYPE_CHECKING

import numpy as np
import onnx

from npu.program import ProgramBuilder
from npu.tensors import Layout

from ..graph import CompileError, node_attrs
from ..programs import choose_tiling, gemm_program, row_stride
from ..quantize import Act, channel_requant
from .registry import rule

if TYPE_CHECKING:
    from ..lower import Lowerer


def _readers(ctx: Lowerer, name: str) -> list[tuple[onnx.NodeProto, int]]:
    """(node, input index) of every operator reading `name`, through QuantizeLinear/DequantizeLinear."""
    out = []
    for c in ctx.graph.consumers.get(name, []):
        if c.op_type in ("QuantizeLinear", "DequantizeLinear"):
            out += _readers(ctx, c.output[0])
        else:
            out += [(c, i) for i, x in enumerate(c.input) if x == name]
    return out


def read_as_rows(ctx: Lowerer, name: str) -> bool:
    """Whether only MatMuls of two activations read the quantised tensor `name` (a host step's
    result, such as attention's Softmax): a 4-D one is then written dense (row-major), not as a
    feature map (HWC)."""
    readers = _readers(ctx, name)
    return bool(readers) and all(_product_of_activations(ctx, c) for c, _ in readers)


def _perm(n: onnx.NodeProto, rank: int) -> tuple[int, ...]:
    p = node_attrs(n).get("perm")
    return tuple(int(x) % rank for x in p) if p is not None else tuple(range(rank - 1, -1, -1))


def _product_of_activations(ctx: Lowerer, n: onnx.NodeProto) -> bool:
    return n.op_type == "MatMul" and all(ctx.src_kind(x) == "act" for x in n.input[:2])


def transpose_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    x = ctx.act_in(n.input[0], n)
    out = ctx.q_out(n.output[0], n)
    if (out.scale, out.zero_point, out.elem) != (x.q.scale, x.q.zero_point, x.q.elem):
        return "a transpose that changes quantisation"
    if x.layout.kind not in ("dense", "perm"):
        return f"a transpose of a tensor laid out as {x.layout.kind} (the NPU transposes dense tensors)"
    if _sole_readers_are_products(ctx, n.output[0]):
        return None
    perm = _perm(n, len(x.q.shape))
    if x.layout.kind != "dense" or perm[-1] != len(perm) - 1:
        return "a transpose that moves the last axis, read by other operators than MatMuls of two activations"
    return None


def _sole_readers_are_products(ctx: Lowerer, name: str) -> bool:
    readers = _readers(ctx, name)
    graph_out = any(name == o or ctx._trace(o) == name for o in ctx.graph.outputs)
    return bool(readers) and not graph_out and all(_product_of_activations(ctx, c) for c, _ in readers)


@rule("Transpose", check=transpose_check, int16=True)
def lower_transpose(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    x = ctx.act_in(n.input[0], n)
    out = ctx.q_out(n.output[0], n)
    rank = len(x.q.shape)
    perm = _perm(n, rank)
    lay = x.layout
    if _sole_readers_are_products(ctx, n.output[0]):
        base = lay.shape if lay.kind == "dense" else lay.base
        inner = tuple(range(rank)) if lay.kind == "dense" else lay.perm
        view = Layout.transposed(base, tuple(inner[p] for p in perm), lay.elem)
        ctx.acts[out.name] = Act(out, x.addr, view)
        ctx.new_frag(n, "view", out.shape)
        return
    # the last axis stays: whole rows move, one 2-D DMA per index of the axes before the last two
    where = ctx.where(n)
    y = ctx.place(out, f"{where} output", Layout.dense(out.shape, lay.elem))
    src = Layout.transposed(lay.shape, perm, lay.elem).strides  # bytes, along the output's axes
    dst = Layout.dense(out.shape, lay.elem).strides
    rows, width = out.shape[-2] if rank > 1 else 1, out.shape[-1] * lay.elem
    pitch = row_stride(ctx.cfg, width)
    half = ctx.cfg.spad_bytes // 2
    per = max(1, min(0xFFFF, rows, half // pitch))
    k = 0
    for idx in product(*(range(d) for d in out.shape[:-2])):
        s0 = x.addr + sum(i * s for i, s in zip(idx, src, strict=False))
        d0 = y.addr + sum(i * s for i, s in zip(idx, dst, strict=False))
        for r0 in range(0, rows, per):
            r = min(per, rows - r0)
            buf = (k % 2) * half
            k += 1
            s_row, d_row = (src[-2], dst[-2]) if rank > 1 else (0, 0)
            b.add("load", spad=buf, dram=s0 + r0 * s_row, rows=r, cols=width, spad_stride=pitch,
                  dram_stride=s_row)  # fmt: skip
            b.add("store", spad=buf, dram=d0 + r0 * d_row, rows=r, cols=width, spad_stride=pitch,
                  dram_stride=d_row)  # fmt: skip
            b.candidate()
    ctx.op_done(n, b, out.shape)


def product_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    """Why the NPU does not run this MatMul of two activations (None: it does)."""
    a, bx = ctx.act_in(n.input[0], n), ctx.act_in(n.input[1], n)
    sa, sb = a.q.shape, bx.q.shape
    if len(sa) < 2 or len(sa) != len(sb) or sa[:-2] != sb[:-2]:
        return f"a product of activations of shapes {list(sa)} and {list(sb)} (broadcast leading dimensions)"
    for what, t in (("first", a), ("second", bx)):
        if t.layout.kind not in ("dense", "perm"):
            return f"a product of activations whose {what} operand is laid out as {t.layout.kind}"
        if t.q.zero_point != 0:
            zp = t.q.zero_point
            return f"a product of activations whose {what} operand has zero point {zp} (not symmetric)"
    if bx.q.elem != 1:
        return "a product of activations whose second operand is int16 (the MATMUL's B^T is int8)"
    if a.layout.strides[-1] != a.q.elem:
        return "a product of activations whose first operand's rows are not contiguous"
    if 1 not in bx.layout.strides[-2:]:
        return "a product of activations whose second operand has neither rows nor columns contiguous"
    if ctx.wide_output(n.output[0]) and len(sa) != 2:
        return "a product of activations whose int32 result the host would read"
    return None


def lower_product(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    where = ctx.where(n)
    a, bx = ctx.act_in(n.input[0], n), ctx.act_in(n.input[1], n)
    *lead, m_, k_ = a.q.shape
    n_ = bx.q.shape[-1]
    ea = a.q.elem
    s_b = np.full(n_, bx.q.scale)
    if ctx.wide_output(n.output[0]):
        cfg, rq, zp_out, relu, ey = ctx.cfg, {"mult": 1, "shift": 0}, 0, False, 1
        y = ctx.place_wide(n.output[0], (m_, n_), a.q.scale * s_b, f"{where} output")
    else:
        yq = ctx.q_out(n.output[0], n)
        relu = False
        if (relu_q := ctx.fuse_relu(n.output[0])) is not None:
            yq, relu = relu_q, True
        cfg, rq = ctx.per_column(b, channel_requant(a.q, s_b, yq, where), where)
        zp_out, ey = yq.zero_point, yq.elem
        y = ctx.place(yq, f"{where} output", Layout.dense(yq.shape, yq.elem))
    wide = ctx.wide_output(n.output[0])
    sa, sb = a.layout.strides, bx.layout.strides
    # B^T[j][t] = B[t][j]: rows j apart by B's column stride, elements t apart by its row stride
    bt_row, bt_col = sb[-1], sb[-2]
    try:
        tiling = choose_tiling(cfg, m_, n_, k_, ea, 1 if wide else ey)
    except ValueError:
        raise CompileError(f"{where}: no GEMM tiling of {m_}x{n_}x{k_} fits the on-chip memories") from None
    per_out = m_ * n_ * (4 if wide else ey)
    for i, idx in enumerate(product(*(range(d) for d in lead))):
        gemm_program(
            cfg, m_, n_, k_,
            a.addr + sum(j * s for j, s in zip(idx, sa, strict=False)),
            bx.addr + sum(j * s for j, s in zip(idx, sb, strict=False)),
            y.addr + i * per_out,
            mult=rq["mult"], shift=rq["shift"], zp_out=zp_out, tiling=tiling, builder=b,
            per_col=rq.get("per_col"), out_i32=wide, relu=relu, ea=ea, ey=1 if wide else ey,
            a_row=sa[-2], bt_row=bt_row, bt_col=bt_col,
        )  # fmt: skip
        b.candidate()
    ctx.op_done(n, b, [math.prod(lead) * m_, n_, k_])
