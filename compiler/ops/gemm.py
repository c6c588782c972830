"""Gemm and MatMul: a tiled GEMM with the bias (and the folded activation zero point) in the
accumulators and requantisation on the vector unit."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from npu.program import ProgramBuilder

from ..graph import CompileError, node_attrs
from ..programs import acc_row_stride, choose_tiling, gemm_program
from ..quantize import channel_requant, out_channel_axis
from ..region import memory_name
from .heads import lower_product, product_check
from .registry import rule

if TYPE_CHECKING:
    from ..lower import Lowerer


def gemm_check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    """The NPU multiplies an activation by constant 2-D weights; anything else runs on the host."""
    a = node_attrs(n)
    if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
        return "transA, alpha or beta other than 0, 1, 1"
    if n.op_type == "MatMul" and ctx.src_kind(n.input[0]) == ctx.src_kind(n.input[1]) == "act":
        return product_check(ctx, n)  # attention's Q K^T and P V (ops/heads.py)
    if ctx.src_kind(n.input[1]) != "const":
        return "the second operand is neither a constant nor a quantised activation"
    if ctx.dq_source(n.input[1], n)[1].ndim != 2:
        return "weights of more than two dimensions (a batched MatMul)"
    rank = len(ctx.shape(n.input[0], n))
    if rank < 2 or (n.op_type == "Gemm" and rank != 2):
        return "an activation of one dimension"
    if rank > 2 and ctx.src_kind(n.input[0]) == "act":
        kind = ctx.act_in(n.input[0], n).layout.kind
        if kind != "dense":
            return f"a {rank}-D activation laid out as {kind}"
    return None


@rule("Gemm", "MatMul", check=gemm_check, int16=True)
def lower_gemm(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    if ctx.src_kind(n.input[1]) == "act":
        lower_product(ctx, n, b)
        return
    where = ctx.where(n)
    x = ctx.act_in(n.input[0], n)
    a = node_attrs(n)
    w, s_w = ctx.weights(n.input[1], n, out_axis=out_channel_axis(n))
    wt = w if a.get("transB", 0) else w.T  # B^T: n x k
    # a MatMul of an N-D activation by 2-D weights multiplies every row of its last axis: one GEMM
    # over the leading dimensions flattened (the row-major bytes are the same)
    *lead, k_ = x.q.shape
    m_ = int(np.prod(lead))
    n_ = wt.shape[0]
    if wt.shape[1] != k_:
        raise CompileError(f"{where}: inner dimensions {k_} and {wt.shape[1]} differ")
    bias = ctx.bias(n, 2, n_, x, s_w) if n.op_type == "Gemm" else np.zeros(n_, np.int64)
    # fold the activation zero point: sum (a - za) w = sum a w - za sum w
    bias = bias - x.q.zero_point * wt.astype(np.int64).sum(axis=1)
    if np.abs(bias).max(initial=0) >= 2**31:
        raise CompileError(f"{where}: folded bias overflows int32")
    # the activation's physical row: a flat view of an HWC tensor permutes (and pads) columns
    ea = x.layout.elem  # int16 activations: 2 bytes an element
    if x.layout.kind == "flat":
        k_phys = x.layout.nbytes // (m_ * ea)
        perm = x.layout.offsets()[0] // ea
        wp = np.zeros((n_, k_phys), np.int8)
        wp[:, perm] = wt
        wt = wp
    w_addr = ctx.const(np.ascontiguousarray(wt, np.int8).tobytes(), f"{where} weights")
    wide, relu = ctx.wide_output(n.output[0]), False
    if wide:  # the accumulators themselves are the output (compiler/outputs.py)
        cfg, rq, zp_out = ctx.cfg, {"mult": 1, "shift": 0}, 0
        y = ctx.place_wide(n.output[0], (m_, n_), x.q.scale * np.asarray(s_w, np.float64), f"{where} output")
    else:
        yq = ctx.q_out(n.output[0], n)
        if (relu_q := ctx.fuse_relu(n.output[0])) is not None:
            yq, relu = relu_q, True  # straight to the Relu's output, clamped at zero
        cfg, rq = ctx.per_column(b, channel_requant(x.q, s_w, yq, where), where)
        zp_out = yq.zero_point
        y = ctx.place(yq, f"{where} output")
    ey = 1 if wide else y.layout.elem
    try:
        k_phys = wt.shape[1]
        tiling_for = lambda c: choose_tiling(c, m_, n_, k_phys, ea, ey)  # noqa: E731
        tiling, block = ctx.gemm_bias(b, cfg, bias, where, tiling_for, (m_, n_))
    except ValueError:
        cm, cn, lanes = cfg.clusters, cfg.pes_per_cluster, cfg.lanes
        raise CompileError(
            f"{where}: no GEMM tiling of {m_}x{n_}x{wt.shape[1]} fits {memory_name(cfg)} and "
            f"{memory_name(cfg, acc=True)}: the smallest ({cm} x {cn} outputs, {lanes} deep) needs "
            f"{2 * (cm * lanes + cn * lanes + cm * cn)} scratchpad and {2 * cm * acc_row_stride(cfg, cn)} "
            "accumulator bytes"
        ) from None
    gemm_program(
        cfg,
        m_,
        n_,
        wt.shape[1],
        x.addr,
        w_addr,
        y.addr,
        mult=rq["mult"],
        shift=rq["shift"],
        zp_out=zp_out,
        bias_addr=None if block else ctx.const(bias.astype("<i4").tobytes(), f"{where} bias"),
        bias_mm=block,
        tiling=tiling,
        builder=b,
        per_col=rq.get("per_col"),
        out_i32=wide,
        relu=relu,
        ea=ea,
        ey=ey,
    )
    ctx.op_done(n, b, [m_, n_, k_])
