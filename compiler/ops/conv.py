"""Conv: 2-D convolution (strides, padding, dilation, groups, depthwise) as per-tap MATMULs over row bands,
split by frame, output channel, input channel or height to fit the scratchpad (compiler/spatial.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import onnx

from npu.program import ProgramBuilder

from ..elementwise import OutputPass, ResidualAdd
from ..graph import CompileError, node_attrs
from ..programs import per_column_table
from ..quantize import Act, QTensor, add_multipliers, channel_requant
from ..spatial import SecondConv, conv_program, geometry
from . import lut
from .registry import placement, rule

if TYPE_CHECKING:
    from ..lower import Lowerer


#: a pair runs as one operator only where the planner estimates it faster than apart (off: always)
PAIR_BY_ESTIMATE = True


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
    bias = _folded_bias(ctx, n, x, w, s_w)
    post = second = planned = None
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
        # or the Add of it and a second convolution of the input (the int16 weights' two layers):
        # that one computed beside it, band by band, as the Add's other operand
        pair = paired_conv(ctx, n, stored) if post is None else None
        taken = _pair_plan(ctx, n, pair, x, w, bias, s_w, yq, lo) if pair is not None else None
        if taken is None:
            pair = None  # the two do not fit beside each other: the second stores its result
        res = pair[0] if pair is not None else residual_add(ctx, stored) if post is None else None
        if res is not None:
            add, r, stored, other, made = res
            post = OutputPass(None, None, 0, False, "", lut=False, residual=r)
            ctx.fused[add.name] = n.name
            deps = [*n.input, other] if pair is None else list(n.input)
        y = ctx.place(stored, f"{where} output")
        if pair is None:
            rq = channel_requant(x.q, s_w, yq, where, lo)
        else:  # as planned dry (its output's layout is the placed one's)
            planned, second, rq = taken
            ctx.fused[pair[1].name] = n.name
            ctx.fused_by[pair[1].name] = n.output[0]
            _mark_relu(ctx, add)
        plan_cfg, rq = ctx.per_column(b, rq, where)
        if second is not None:  # its pairs are the table's too, past the first's
            joint = {k: v for k, v in rq.items() if k in ("mult", "shift", "per_col")}
            second = replace(second, rq={**second.rq, **joint})
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
        second=second,
        planned=planned,
    )
    if post is not None and post.lut:  # (the function's view fragment follows: its readers wait for it)
        info["split"] += f"; then {t.op_type} {t.name} on each band ({post.how})"
    if second is not None:
        info["split"] += f"; with {pair[1].name} beside it on each band (the Add's other operand)"
    if post is not None and post.residual is not None:  # it reads the Add's other operand too
        info["split"] += f"; then Add {post.residual.name} on each band (VADD)"
        # and it makes the Add's output (and its Relu's): a reader lowered before the Add's own
        # node (the next residual's convolution) depends on this fragment
        n = onnx.helper.make_node(n.op_type, deps, [*n.output, *made], name=n.name)
    ctx.op_done(n, b, y.q.shape, info)


def _sole_add(ctx: Lowerer, q: QTensor) -> tuple[onnx.NodeProto, bool, str, str] | None:
    """The Add of two activations, on the NPU, that alone reads `q`, and of two different tensors:
    (the Add, whether `q` is its first operand, its other operand, that operand's quantised tensor)."""
    lut.plan(ctx)
    readers = ctx._lut_readers.get(q.name, [])
    if len(readers) != 1 or readers[0].op_type not in ("Add", "Sum") or not readers[0].name:
        return None
    if lut.graph_output(ctx, q.name):  # it must be stored as it is
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
    return add, first, other, ctx.graph.producers[other].input[0]


def residual_add(
    ctx: Lowerer, q: QTensor
) -> tuple[onnx.NodeProto, ResidualAdd, QTensor, str, list[str]] | None:
    """The Add of two activations that alone reads `q` (a convolution's result as it would be
    stored), on the NPU, whose other operand is computed already in the layout `q` would have: the
    Add, the residual step for the output pass, the Add's output (what is stored instead), the
    other operand's name and the tensors the convolution now makes (the Add's, its Relu's); else
    None."""
    found = _sole_add(ctx, q)
    if found is None:
        return None
    add, first, other, src = found
    if src not in ctx.acts:
        return None  # computed later (or on the host)
    xo = ctx.acts[src]
    if xo.layout != ctx.default_layout(q) or xo.q.elem != q.elem:
        return None
    step = _add_step(ctx, add, q, xo.q, first, xo.addr)
    if step is None:
        return None
    _mark_relu(ctx, add)
    return add, step[0], step[1], other, step[2]


def _mark_relu(ctx: Lowerer, add: onnx.NodeProto) -> None:
    """The Relu after `add` (if `_add_step` folded one in) lowers as a view: the Add's VADD clamps."""
    ctx.fuse_relu(add.output[0])


def _add_step(
    ctx: Lowerer, add: onnx.NodeProto, q: QTensor, qo: QTensor, first: bool, addr: int | None
) -> tuple[ResidualAdd, QTensor, list[str]] | None:
    """The output pass's VADD for `add` of `q` and `qo` (the other operand at DRAM `addr`, or None:
    computed on chip), the Add's output as stored (its Relu's, folded in) and the tensors made.
    Marks nothing: the caller that takes the step marks the Relu (`_mark_relu`)."""
    yq, lo = ctx.q_out(add.output[0], add), -128
    if yq.elem != q.elem:
        return None
    made = [add.output[0]]
    if (relu_q := ctx.fuse_relu(add.output[0], mark=False)) is not None:  # the sum clamped at 0
        yq, lo = relu_q, 0 if relu_q.wide else relu_q.zero_point
        made.append(ctx.fusable_relu(add.output[0])[0].output[0])
    qa, qb = (q, qo) if first else (qo, q)
    ma, mb, shift = add_multipliers(qa.scale / yq.scale, qb.scale / yq.scale, ctx.where(add))
    params = dict(mult_a=ma, mult_b=mb, shift=shift, zp_a=qa.zero_point, zp_b=qb.zero_point,
                  zp_out=yq.zero_point, lo=lo)  # fmt: skip
    return ResidualAdd(addr, params, q.elem, first, add.name), yq, made


def paired_conv(
    ctx: Lowerer, n: onnx.NodeProto, q: QTensor
) -> tuple[tuple[onnx.NodeProto, ResidualAdd, QTensor, str, list[str]], onnx.NodeProto] | None:
    """The Add that alone reads `q` (convolution `n`'s result as it would be stored) when its other
    operand is made by a second convolution, not lowered yet, of the same input, weights' shape and
    attributes, which only that Add reads - the int16 weights' two layers (compiler/wide_weights.py)
    are such a pair: (`residual_add`'s tuple, the residual computed on chip; the second convolution),
    else None. The second then runs beside `n` (`spatial.SecondConv`) and lowers as a view."""
    found = _sole_add(ctx, q)
    if found is None:
        return None
    add, first, other, src = found
    qn = ctx.graph.producers.get(src)
    if src in ctx.acts or qn is None or qn.op_type != "QuantizeLinear" or lut.graph_output(ctx, src):
        return None
    m = ctx.graph.producers.get(qn.input[0])
    if m is None or m.op_type != "Conv" or not m.name or m.name in ctx.reasons or m.name in ctx.fused:
        return None
    if len(ctx.graph.consumers.get(m.output[0], [])) != 1 or ctx._lut_readers.get(src, []) != [add]:
        return None
    if m.output[0] in ctx.graph.outputs or placement(ctx, m) is not None or ctx.wide_output(m.output[0]):
        return None
    dq_m, dq_n = ctx.graph.producers.get(m.input[0]), ctx.graph.producers[n.input[0]]
    if ctx.src_kind(m.input[0]) != "act" or dq_m.input != dq_n.input:  # not the same quantised input
        return None
    if node_attrs(m) != node_attrs(n) or ctx.src_kind(m.input[1]) != "const":
        return None
    if ctx.dq_source(m.input[1], m)[1].shape != ctx.dq_source(n.input[1], n)[1].shape:
        return None
    qm = ctx.q_out(m.output[0], m)
    if qm.elem != q.elem or qm.shape != q.shape:
        return None
    step = _add_step(ctx, add, q, qm, first, None)
    if step is None:
        return None
    return (add, step[0], step[1], other, [m.output[0], *step[2]]), m


def _pair_plan(ctx: Lowerer, n: onnx.NodeProto, pair, x, w, bias, s_w, yq: QTensor, lo: int):
    """The tiling of convolution `n` with the second of `pair` (`paired_conv`) beside it, the second
    (`_second_conv`) and the joint requantisation: `conv_program`'s plan, dry (nothing emitted,
    placed or allocated), which the lowering takes as it is; None when none fits, or when
    the planner's estimate for the two apart (the first alone, the second adding the first's
    stored result as a residual) is lower, with one band of each: the estimate is each operator's
    busiest unit over its bands, and apart the first's last band drains and the second's first
    fills at the boundary between them, which the pair does not have."""
    a, where, stored = node_attrs(n), ctx.where(n), pair[0][2]
    y = Act(stored, 0, ctx.default_layout(stored))
    own = channel_requant(x.q, s_w, yq, where, lo)
    second, rq = _second_conv(ctx, pair[1], x, w.shape[0], y.layout.cp, own)
    plan_cfg, table = per_column_table(ctx.cfg, rq["mult"], rq["shift"])[:2]
    if table is None and per_column_table(ctx.cfg, own["mult"], own["shift"])[1] is not None:
        return None  # the joint table does not fit where the first's alone does: a VMAP a column
    geo = geometry(x, y, w.shape[2:], a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0]), where,
                   a.get("dilations", [1, 1]))  # fmt: skip

    def plan(weights, bias_, rq_, post, second_=None):
        cfg = per_column_table(ctx.cfg, rq_["mult"], rq_["shift"])[0]
        return conv_program(ProgramBuilder(cfg), cfg, x, y, weights, bias_, a.get("group", 1), geo, rq_,
                            lambda *_: 0, where, ctx.step, ctx.max_live, post, narrow=ctx.narrow_depthwise,
                            fold=ctx.im2col, second=second_, dry=True)["planned"]  # fmt: skip

    residual = OutputPass(None, None, 0, False, "", lut=False, residual=pair[0][1])
    try:
        planned = plan(w, bias, rq, residual, second)
    except CompileError:
        return None
    if not PAIR_BY_ESTIMATE:
        return planned, second, rq
    try:  # apart: the second's residual tile is loaded from the first's result in DRAM
        loaded = replace(residual, residual=replace(pair[0][1], addr=0))
        sides = [plan(w, bias, own, None), plan(second.weights, second.bias, second.rq, loaded)]
    except CompileError:
        return planned, second, rq
    apart = sum(p.est_cycles + p.est_cycles // p.bands(geo, y.layout.cp) for p, _ in sides)
    return (planned, second, rq) if planned[0].est_cycles <= apart else None


def _folded_bias(ctx: Lowerer, n: onnx.NodeProto, x, w: np.ndarray, s_w) -> np.ndarray:
    """Convolution `n`'s int32 bias with its input's zero point folded in (checked to fit)."""
    bias = ctx.bias(n, 2, w.shape[0], x, s_w) - x.q.zero_point * w.astype(np.int64).sum(axis=(1, 2, 3))
    if np.abs(bias).max(initial=0) >= 2**31:
        raise CompileError(f"{ctx.where(n)}: folded bias overflows int32")
    return bias


def _second_conv(
    ctx: Lowerer, m: onnx.NodeProto, x, cout: int, cpy: int, rq: dict
) -> tuple[SecondConv, dict]:
    """Convolution `m` as the `SecondConv` of a pair (`paired_conv`), and the first's requantisation
    `rq` with per-channel pairs for both: the first's `cpy` columns (its padding taking its last
    pair), then the second's."""
    w, s_w = ctx.weights(m.input[1], m)
    bias = _folded_bias(ctx, m, x, w, s_w)
    rq2 = channel_requant(x.q, s_w, ctx.q_out(m.output[0], m), ctx.where(m))

    def cols(r: dict, key: str, n: int) -> np.ndarray:
        v = np.broadcast_to(np.asarray(r[key], np.int64), (cout,))
        return np.concatenate([v, np.full(n - cout, v[-1])])

    both = {**rq, "mult": np.concatenate([cols(rq, "mult", cpy), cols(rq2, "mult", cout)]),
            "shift": np.concatenate([cols(rq, "shift", cpy), cols(rq2, "shift", cout)])}  # fmt: skip
    return SecondConv(w, bias, rq2, col0=cpy), both
