"""Conv: 2-D convolution (strides, padding, dilation, groups, depthwise) as per-tap MATMULs over row bands,
split by frame, output channel, input channel or height to fit the scratchpad (compiler/spatial.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import onnx

from npu.arith import round_up
from npu.program import ProgramBuilder
from npu.timing import a_pitch

from .. import pointwise
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
#: a depthwise convolution computes the 1 x 1 convolution that alone reads it (compiler/pointwise.py),
#: where the planner estimates that faster than apart (FUSE_BY_ESTIMATE off: wherever it fits)
FUSE_POINTWISE = True
FUSE_BY_ESTIMATE = True


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
    post = second = planned = then = None
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
        fused = None
        if post is None and groups > 1 and cin_g == 1 and cout == groups and FUSE_POINTWISE:
            own = channel_requant(x.q, s_w, yq, where, lo)
            fused = _fuse_pointwise(ctx, n, b, x, w, bias, stored, own, a)
        y = ctx.place(stored, f"{where} output") if fused is None else fused[0]
        if fused is not None:  # the 1 x 1 convolution after it on each band: planned, its tables loaded
            plan_cfg, rq, then, planned, made, pw_est = fused[1:]
        elif pair is None:
            rq = channel_requant(x.q, s_w, yq, where, lo)
        else:  # as planned dry (its output's layout is the placed one's)
            planned, second, rq = taken
            ctx.fused[pair[1].name] = n.name
            ctx.fused_by[pair[1].name] = n.output[0]
            _mark_relu(ctx, add)
        if fused is None:
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
        then=then,
    )
    if post is not None and post.lut:  # (the function's view fragment follows: its readers wait for it)
        info["split"] += f"; then {t.op_type} {t.name} on each band ({post.how})"
    if second is not None:
        info["split"] += f"; with {pair[1].name} beside it on each band (the Add's other operand)"
    if then is not None:  # it makes the 1 x 1 convolution's output (and its Relu's)
        info["split"] += f"; then {then[0].name} (1 x 1) on each band, its input kept on chip"
        info["est_cycles"] += pw_est
        n = onnx.helper.make_node(n.op_type, list(n.input), [*n.output, *made], name=n.name)
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
        conv = (x, y, weights, bias_, a.get("group", 1), geo, rq_)
        return _dry_plan(ctx, cfg, conv, where, post, second=second_)

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


def _pointwise_reader(ctx: Lowerer, stored: QTensor) -> onnx.NodeProto | None:
    """The 1 x 1 convolution (stride 1, no padding, one group, constant weights, on the NPU) that
    alone reads `stored`, a depthwise convolution's result, where it would need no output pass of
    its own (no table function or Add after it, not int32 results), else None."""
    lut.plan(ctx)
    readers = ctx._lut_readers.get(stored.name, [])
    if len(readers) != 1 or lut.graph_output(ctx, stored.name):
        return None
    pw = readers[0]
    if pw.op_type != "Conv" or not pw.name or pw.name in ctx.reasons or pw.name in ctx.fused:
        return None
    if placement(ctx, pw) is not None or ctx.src_kind(pw.input[1]) != "const":
        return None
    if ctx.wide_output(pw.output[0]):
        return None
    a = node_attrs(pw)
    if a.get("group", 1) != 1 or any(v != 1 for v in [*a.get("strides", [1]), *a.get("dilations", [1])]):
        return None
    w = ctx.dq_source(pw.input[1], pw)[1]
    if any(a.get("pads", [0])) or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    if w.shape[2:] != (1, 1) or w.shape[1] != stored.shape[1]:
        return None
    if lut.sole_reader(ctx, pw.output[0]) is not None:  # a function it would compute on its tiles
        return None
    relu_q = ctx.fuse_relu(pw.output[0], mark=False)
    return None if _sole_add(ctx, relu_q or ctx.q_out(pw.output[0], pw)) is not None else pw


def _fuse_pointwise(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder, x: Act, w, bias, stored: QTensor,
                    rq: dict, a: dict):  # fmt: skip
    """Depthwise convolution `n` with the 1 x 1 convolution that alone reads its result
    (`_pointwise_reader`) on each of its bands (compiler/pointwise.py), where a tiling of one output
    tile fits beside the 1 x 1 layer's weights and buffers: (its result's Act, never stored; the
    configuration to emit it with, its requantisation, the 1 x 1 layer and its places, the plan,
    the tensors it makes, the node), the tables of both loaded; else None, nothing changed."""
    pw_node = _pointwise_reader(ctx, stored)
    if pw_node is None:
        return None
    where, pw_where = ctx.where(n), ctx.where(pw_node)
    # never stored: its pixels at the pitch that keeps the 1 x 1 layer's A reads in different banks
    own = ctx.default_layout(stored)
    y = Act(stored, 0, replace(own, cp=a_pitch(ctx.cfg, own.cp, stored.elem)))
    if not np.array_equal(y.layout.chan[: stored.shape[1]], np.arange(stored.shape[1])):
        return None
    w2, s_w2 = ctx.weights(pw_node.input[1], pw_node)
    yq2, lo2 = ctx.q_out(pw_node.output[0], pw_node), -128
    if (relu_q := ctx.fuse_relu(pw_node.output[0], mark=False)) is not None:
        yq2, lo2 = relu_q, 0 if relu_q.wide else relu_q.zero_point
    own_rq, own_rq2 = rq, channel_requant(stored, s_w2, yq2, pw_where, lo2)
    # both tables at the scratchpad's top, the 1 x 1 layer's below the depthwise layer's (as planned
    # here; `ctx.per_column` loads them the same way once the two are taken)
    cfg1, pc1, _ = per_column_table(ctx.cfg, rq["mult"], rq["shift"])
    cfg2, pc2, _ = per_column_table(cfg1, own_rq2["mult"], own_rq2["shift"])
    rq = {**rq, "per_col": pc1} if pc1 is not None else rq
    rq2 = {**own_rq2, "per_col": pc2} if pc2 is not None else own_rq2
    y2 = Act(yq2, 0, ctx.default_layout(yq2))
    pw = pointwise.Pointwise(w2[:, :, 0, 0], _folded_bias(ctx, pw_node, y, w2, s_w2), rq2, y2, pw_node.name)
    geo = geometry(x, y, w.shape[2:], a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0]), where,
                   a.get("dilations", [1, 1]))  # fmt: skip
    conv = (x, y, w, bias, a.get("group", 1), geo, rq)
    # the 1 x 1 layer's accumulators apart, or in the depthwise tiles: the lower estimate
    k = round_up(stored.shape[1], ctx.cfg.lanes)  # its MATMUL's k: the channels, not the bank padding
    tries = [t for reuse in (False, True) if (t := _fused_plan(ctx, cfg2, pw, conv, k, where, reuse))]
    if not tries:
        return None
    one, bands, view, places, planned = min(tries, key=lambda t: t[0])
    # one band: nothing of either layer runs under the other's (MobileNet's 3 x 3 x 256 layer was
    # 0.6 % slower for the whole model, its estimate 50 % faster)
    apart = (x, Act(stored, 0, own), w, bias, a.get("group", 1), geo, own_rq)  # its result stored
    if FUSE_BY_ESTIMATE and (bands < 2 or not _pointwise_pays(ctx, (n, pw_node), apart, pw, one)):
        return None
    ctx.per_column(b, own_rq, where)
    ctx.per_column(b, own_rq2, pw_where, cfg1)
    ctx.fused[pw_node.name] = n.name
    ctx.fused_by[pw_node.name] = n.output[0]
    made = [pw_node.output[0]]
    if ctx.fuse_relu(pw_node.output[0]) is not None:
        made.append(ctx.fusable_relu(pw_node.output[0])[0].output[0])
    pw = replace(pw, y=ctx.place(yq2, f"{pw_where} output"))
    return y, view, rq, (pw, places), planned, made, one - planned[0].est_cycles


def _fused_plan(ctx: Lowerer, cfg, pw, conv: tuple, k: int, where: str, reuse: bool):
    """The depthwise convolution `conv` (input, output, weights, bias, groups, geometry,
    requantisation) planned with the 1 x 1 layer `pw` on each band (`pointwise.reserve`'s places,
    `reuse` as there): (the estimate of both, the bands, the configuration, the places, the plan),
    or None where nothing fits, the plan splits the channels (the 1 x 1 layer reads every channel
    of a band at once) or it would keep cancellation points out of the operator."""
    y, geo = conv[1], conv[5]
    got = pointwise.reserve(cfg, pw, y.layout.cp, k, reuse)
    if got is None:
        return None
    view, places = got
    try:
        planned = _dry_plan(ctx, view, conv, where, then=(pw, places))
    except CompileError:
        return None
    plan, gp = planned
    cp = y.layout.cp
    if plan.co_t < cp:
        return None
    m_pw = min(plan.m(gp), plan.rows * gp.ow)  # its MATMUL's rows: the band's pixels, back to back
    bands = plan.bands(geo, cp)
    one = plan.est_cycles + pointwise.cycles(view, pw, places, cp, y.q.elem, m_pw, bands)
    # with cancellation points: a band of both layers within the interval, and what the 1 x 1 layer
    # keeps on chip between bands within the live limit (else no point could go inside it)
    too_live = bool(ctx.max_live) and places.resident > ctx.max_live
    if ctx.step and bands > 1 and (one // bands > ctx.step or too_live):
        return None
    return one, bands, view, places, planned


def _pointwise_pays(ctx: Lowerer, nodes, conv: tuple, pw, fused: int) -> bool:
    """Whether the planner's estimate for the depthwise and the 1 x 1 convolution (`nodes`) as one
    operator (`fused`: the depthwise layer's estimate in what the 1 x 1 layer leaves it, plus the
    1 x 1 layer's matrix cycles) is below the two apart (each planned alone: `conv`, the depthwise
    layer's input, output as stored, weights, bias, groups, geometry and requantisation, and `pw`
    reading that output; with one band of each: apart, the first's last band drains and the
    second's first fills at the boundary between them, which the one operator does not have)."""
    y = conv[1]
    geo2 = geometry(y, pw.y, (1, 1), [1, 1], [0, 0, 0, 0], ctx.where(nodes[1]))
    sides = []
    second = (y, pw.y, pw.weights[:, :, None, None], pw.bias, 1, geo2, pw.rq)
    for node, side in zip(nodes, (conv, second), strict=True):
        r = {k: v for k, v in side[6].items() if k != "per_col"}
        cfg = per_column_table(ctx.cfg, r["mult"], r["shift"])[0]
        try:
            plan, _ = _dry_plan(ctx, cfg, (*side[:6], r), ctx.where(node))
        except CompileError:
            return True  # apart does not fit
        sides.append(plan.est_cycles + plan.est_cycles // plan.bands(side[5], side[1].layout.cp))
    return fused < sum(sides)


def _dry_plan(ctx: Lowerer, cfg, conv: tuple, where: str, post: OutputPass | None = None, **kw):
    """`conv_program`'s plan of a convolution (`conv`: input, output, weights, bias, groups,
    geometry, requantisation) on `cfg`, dry: nothing emitted, placed or allocated."""
    return conv_program(ProgramBuilder(cfg), cfg, *conv, lambda *_: 0, where, ctx.step, ctx.max_live, post,
                        narrow=ctx.narrow_depthwise, fold=ctx.im2col, dry=True, **kw)["planned"]  # fmt: skip
