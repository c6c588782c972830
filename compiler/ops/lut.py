"""Element-wise functions of one int8 activation through the vector unit's 256-entry table (VLUT).

A node whose output, followed back through element-wise operators and QuantizeLinear /
DequantizeLinear pairs, depends on a single int8 activation and scalar constants is a function of
that activation's 256 possible values: Sigmoid, Tanh, HardSwish, GELU, LeakyRelu, Exp, a Mul or Add
of a scalar, and the decompositions exporters write (SiLU = x * Sigmoid(x), HardSwish =
x * Relu6(x + 3) / 6). Its table holds the node's output, quantised to the output's scale, for each
input value: the nodes are evaluated (`onnx.reference`, float32 as onnxruntime does) on the
dequantised inputs, and every QuantizeLinear passed on the way rounds as it would in the int8
graph, so the NPU computes what the QDQ graph computes.

A node of such a chain whose int8 output only feeds later table functions (which read the chain's
source themselves) is absorbed: it gets no pass of its own.

A function of an int16 activation is evaluated on all 65536 codes and then computed in int8 where
it varies (`table16`): the source is narrowed to int8 over the range where the function is not
constant, the table looks the narrowed value up, and either the table is a gate the source is
multiplied by (y = f(0) + x * g(x): HardSwish, SiLU, GELU, LeakyRelu, an affine after them; the
result keeps int16 resolution)
or its int8 value is widened to the output (Sigmoid, HardSigmoid, Tanh: results of a bounded range).
The choice with the smaller error over the calibrated range is taken, simulated bit-exactly.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from npu.program import ProgramBuilder
from npu.sim.golden.kernels import requant

from ..elementwise import OutputPass, lut16_program, lut_program, step_unit
from ..graph import CompileError, node_attrs
from ..quantize import QTensor, quant_multiplier

if TYPE_CHECKING:
    from ..lower import Lowerer

#: element-wise operators of one or two tensors (the second, if not the same activation, a scalar)
UNARY = {
    "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "LeakyRelu", "Elu", "Selu", "Celu", "Softplus",
    "Softsign", "Exp", "Log", "Neg", "Abs", "Sqrt", "Reciprocal", "Erf", "Gelu", "Mish",
    "ThresholdedRelu", "Sin", "Cos", "Floor", "Ceil", "Round", "Sign", "Relu", "Clip", "Identity",
}  # fmt: skip
BINARY = {"Add", "Sub", "Mul", "Div", "Pow", "Min", "Max", "PRelu"}
OPS = UNARY | BINARY
#: the int8 values a table is indexed by, in table order
CODES = np.arange(-128, 128, dtype=np.int64)
MAX_DEPTH = 12  # nodes followed back from one output (bounds compile time on long chains)

Fn = Callable[[], np.ndarray]  # real values (float32) for the 256 codes of the source


@dataclass(frozen=True)
class Lut:
    """A node as a table function: the int8 tensor it reads (a QuantizeLinear output) and its real
    output for each of that tensor's 256 codes."""

    source: str
    values: np.ndarray


def codes(q: QTensor) -> np.ndarray:
    """Every value of a quantised tensor's type, in order (256 for int8, 65536 for int16)."""
    return np.arange(q.qmin, q.qmax + 1, dtype=np.int64)


def _dequant(q: QTensor) -> np.ndarray:
    return ((codes(q) - q.zero_point).astype(np.float32) * np.float32(q.scale)).astype(np.float32)


def _fake_quant(v: np.ndarray, q: QTensor) -> np.ndarray:
    """QuantizeLinear then DequantizeLinear, as the quantised graph rounds (half to even, saturating)."""
    c = table(v, q.scale, q.zero_point, q.qmin, q.qmax).astype(np.int64)
    return (c - q.zero_point).astype(np.float32) * np.float32(q.scale)


class _Tracer:
    """For each float tensor: the int8 sources it is a function of, shallow to deep, with values."""

    def __init__(self, ctx: Lowerer):
        self.ctx = ctx
        self.memo: dict[tuple[str, int], list[tuple[str, np.ndarray]]] = {}
        self.opset = next(o.version for o in ctx.graph.model.opset_import if o.domain in ("", "ai.onnx"))

    def const(self, name: str) -> np.ndarray | None:
        """A scalar constant's real value (None if not a constant, or not a scalar)."""
        ctx = self.ctx
        if name in ctx.consts:
            v = ctx.consts[name]
        elif ctx.src_kind(name) == "const":
            s = ctx.dq_source(name, ctx.graph.producers[name])
            v = (s[1].astype(np.float32) - s[3]) * np.asarray(s[2], np.float32).reshape(-1)[0]
        else:
            return None
        v = np.asarray(v)
        if v.dtype.kind not in "fiu" or v.size != 1:
            return None
        return v.astype(np.float32)

    def options(self, name: str, depth: int = 0) -> list[tuple[str, np.ndarray]]:
        key = (name, depth)
        if key not in self.memo:
            self.memo[key] = self._options(name, depth)
        return self.memo[key]

    def _options(self, name: str, depth: int) -> list[tuple[str, np.ndarray]]:
        ctx = self.ctx
        p = ctx.graph.producers.get(name)
        if p is None or depth > MAX_DEPTH:
            return []
        if p.op_type == "DequantizeLinear":
            q = p.input[0]
            if q in ctx.consts or q not in ctx.qt:
                return []
            qt = ctx.qt[q]
            out = [(q, _dequant(qt))]
            qn = ctx.graph.producers.get(q)
            if qn is not None and qn.op_type == "QuantizeLinear":
                for src, v in self.options(qn.input[0], depth + 1):
                    out.append((src, _fake_quant(v, qt)))
            return out
        if p.op_type not in OPS or p.domain not in ("", "ai.onnx") or len(p.output) != 1:
            return []
        return self.node_options(p, depth)

    def node_options(self, n: onnx.NodeProto, depth: int = 0) -> list[tuple[str, np.ndarray]]:
        """`n`'s output as a function of each int8 source every activation input shares."""
        acts, consts = [], {}
        for i, name in enumerate(n.input):
            if not name:
                continue
            c = self.const(name)
            if c is not None:
                consts[i] = c
                continue
            opts = self.options(name, depth + 1)
            if not opts:
                return []
            acts.append((i, dict(opts)))
        if not acts:
            return []
        common = [s for s in acts[0][1] if all(s in a for _, a in acts[1:])]
        return [(s, _evaluate(n, {i: a[s] for i, a in acts}, consts, self.opset)) for s in common]


def _evaluate(
    n: onnx.NodeProto, acts: dict[int, np.ndarray], consts: dict[int, np.ndarray], opset: int
) -> np.ndarray:
    """`n` on float32 inputs (activation inputs: 256 values; constants: scalars), flattened."""
    names = [f"i{k}" if k in acts or k in consts else "" for k in range(len(n.input))]
    inputs = [
        helper.make_tensor_value_info(names[k], onnx.TensorProto.FLOAT, [len(v)]) for k, v in acts.items()
    ]
    inits = [numpy_helper.from_array(v.astype(np.float32), names[k]) for k, v in consts.items()]
    node = helper.make_node(n.op_type, names, ["y"], **node_attrs(n))
    out = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    m = helper.make_model(
        helper.make_graph([node], "lut", inputs, [out], inits), opset_imports=[helper.make_opsetid("", opset)]
    )
    with np.errstate(all="ignore"):
        y = ReferenceEvaluator(m).run(None, {names[k]: v.astype(np.float32) for k, v in acts.items()})[0]
    return np.asarray(y, np.float32).reshape(-1)


def _own_rule(ctx: Lowerer, n: onnx.NodeProto) -> bool:
    """Nodes another lowering runs cheaper (a requantising clamp, the sum of two activations)."""
    if n.op_type in ("Relu", "Clip", "Identity"):
        return True
    ins = [i for i in n.input if i]
    return (
        n.op_type in ("Add", "Sum")
        and len(ins) == 2
        and all(ctx.src_kind(i) == "act" for i in ins)
        and ctx.shape(ins[0], n) == ctx.shape(ins[1], n)
    )


def plan(ctx: Lowerer) -> dict[str, Lut]:
    """Table functions by node name (computed once per lowering): every node of `OPS` whose output
    feeds one QuantizeLinear and is a function of one int8 activation, at its deepest source."""
    if ctx._lut_plan is not None:
        return ctx._lut_plan
    tr = _Tracer(ctx)
    out = {}
    for n in ctx.graph.nodes:
        if n.op_type not in OPS or n.domain not in ("", "ai.onnx") or len(n.output) != 1 or _own_rule(ctx, n):
            continue
        if n.name in ctx.host_nodes:  # the host computes it from its own input
            continue
        cs = ctx.graph.consumers.get(n.output[0], [])
        if len(cs) != 1 or cs[0].op_type != "QuantizeLinear":
            continue
        opts = tr.node_options(n)
        if opts:
            src, v = opts[-1]
            out[n.name or n.output[0]] = Lut(src, v)
    ctx._lut_plan = out
    ctx._lut_absorbed = _absorbed(ctx, out, tr)
    ctx._lut_readers = _readers(ctx, out)
    return out


def _readers(ctx: Lowerer, luts: dict[str, Lut]) -> dict[str, list[onnx.NodeProto]]:
    """The kept nodes reading each tensor (`sole_reader`'s question, for every tensor at once): a
    table function reads its source, any other node its inputs (an int8 tensor through its
    DequantizeLinear nodes); absorbed nodes and the quantisation nodes read nothing."""
    g = ctx.graph
    deq = {n.output[0]: n.input[0] for n in g.nodes if n.op_type == "DequantizeLinear"}
    out: dict[str, list[onnx.NodeProto]] = {}
    for n in g.nodes:
        key = n.name or (n.output[0] if n.output else "")
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") or key in ctx._lut_absorbed:
            continue
        srcs = {luts[key].source} if key in luts else {*n.input, *(deq[i] for i in n.input if i in deq)}
        for src in srcs:
            out.setdefault(src, []).append(n)
    return out


def _absorbed(ctx: Lowerer, luts: dict[str, Lut], tr: _Tracer) -> set[str]:
    """Steps of table functions that no kept node reads: table nodes, clamps and float element-wise
    nodes whose outputs only feed later tables (which read their own sources). Walks the graph
    backwards, counting the kept readers of each tensor (an int8 tensor is read through its
    DequantizeLinear nodes)."""
    g = ctx.graph
    outputs = set(g.outputs)
    cands: dict[str, str] = {}  # node -> the tensor it makes (int8 if quantised, else float)
    for n in g.nodes:
        if len(n.output) != 1 or n.op_type not in OPS:
            continue
        key = n.name or n.output[0]
        cs = g.consumers.get(n.output[0], [])
        if len(cs) == 1 and cs[0].op_type == "QuantizeLinear":
            if key in luts or n.op_type in ("Relu", "Clip"):
                cands[key] = cs[0].output[0]
        elif n.output[0] not in outputs and tr.options(n.output[0]):
            cands[key] = n.output[0]
    reads: dict[str, int] = {}
    gone: set[str] = set()
    for n in reversed(g.nodes):
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue  # transparent: the nodes around them read and write
        key = n.name or (n.output[0] if n.output else "")
        if key in cands:
            t = cands[key]
            if (
                not reads.get(t)
                and t not in outputs
                and not any(o in outputs for d in g.consumers.get(t, []) for o in d.output)
            ):
                gone.add(key)
                continue
        if key in luts:
            reads[luts[key].source] = reads.get(luts[key].source, 0) + 1
            continue
        for i in n.input:
            p = g.producers.get(i)
            t = p.input[0] if p is not None and p.op_type == "DequantizeLinear" else i
            reads[t] = reads.get(t, 0) + 1
    return gone


def is_absorbed(ctx: Lowerer, n: onnx.NodeProto) -> bool:
    plan(ctx)
    return (n.name or (n.output[0] if n.output else "")) in ctx._lut_absorbed


def graph_output(ctx: Lowerer, name: str) -> bool:
    """Whether quantised tensor `name`, its float source or its dequantised value is a graph output
    (such a tensor has to be stored as it is)."""
    g = ctx.graph
    q = g.producers.get(name)
    if name in g.outputs or (q is not None and q.input[0] in g.outputs):
        return True
    return any(o in g.outputs for d in g.consumers.get(name, []) for o in d.output)


def sole_reader(ctx: Lowerer, name: str) -> onnx.NodeProto | None:
    """The table function that alone reads what a node makes as `name` (through its
    QuantizeLinear), of the same element type, where the producer may compute it on each output
    tile (`output_pass`) instead of a pass of its own over DRAM; None otherwise. A table function
    reads its source (the nodes between are absorbed); a tensor that is a graph output, or read by
    anything else, has to be stored as it is."""
    cs = ctx.graph.consumers.get(name, [])
    if len(cs) != 1 or cs[0].op_type != "QuantizeLinear":
        return None
    src = cs[0].output[0]
    if graph_output(ctx, src):
        return None
    luts = plan(ctx)
    readers = ctx._lut_readers.get(src, [])
    if len(readers) != 1 or not readers[0].name or readers[0].name not in luts:
        return None
    t = readers[0]
    if t.name in ctx.reasons or check(ctx, t) is not None:
        return None
    return t if ctx.q_out(t.output[0], t).elem == ctx.qt[src].elem else None


def output_pass(ctx: Lowerer, t: onnx.NodeProto) -> tuple[OutputPass, QTensor]:
    """Table function `t` (`sole_reader`) as its source's producer computes it on each output tile,
    and its output's quantisation (what the producer stores)."""
    lut = plan(ctx)[t.name]
    xq, yq = ctx.qt[lut.source], ctx.q_out(t.output[0], t)
    where = ctx.where(t)
    if xq.wide:
        u = table16(lut.values, xq, yq, where)
        addr = None if u.table is None else ctx.const(u.table.tobytes(), f"{where} table")
        how = f"int16 through a {u.how}: error {u.error:.2f} steps"
        return OutputPass(addr, u.passes, yq.zero_point, u.zero != yq.zero_point, how), yq
    tb = table(lut.values, yq.scale, yq.zero_point)
    addr = ctx.const(tb.tobytes(), f"{where} table")
    fix = int(tb[xq.zero_point + 128]) != yq.zero_point
    return OutputPass(addr, None, yq.zero_point, fix, "256-entry table (VLUT)"), yq


def as_reading_source(ctx: Lowerer, n: onnx.NodeProto) -> onnx.NodeProto:
    """A table function's node as reading its source (the nodes between are absorbed or run on
    their own): what its fragment depends on."""
    lut = plan(ctx).get(n.name or n.output[0])
    return n if lut is None else helper.make_node(n.op_type, [lut.source], list(n.output), name=n.name)


def check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    lut = plan(ctx).get(n.name or n.output[0])
    if lut is None:
        return (
            "not a function of one activation and scalar constants, or its output does not feed "
            "exactly one QuantizeLinear"
        )
    if not ctx.qt[lut.source].wide and ctx.q_out(n.output[0], n).wide:
        return "a table function from int8 to int16"
    return None


def table(values: np.ndarray, scale: float, zp: int, lo: int = -128, hi: int = 127) -> np.ndarray:
    """`values` quantised to the output's scale (NaN: the zero point), int8 (or to [lo, hi])."""
    q = np.clip(np.rint(values.astype(np.float32) / np.float32(scale)) + zp, lo, hi)
    return np.where(np.isnan(values), zp, q).astype(np.int8 if hi <= 127 else np.int16)


def _pad_runs(lay) -> list[tuple[int, int]]:
    """(offset, width) runs of the padding channels of an hwc layout's pixel, in elements."""
    real = np.zeros(lay.cp, bool)
    real[list(lay.chan)] = True
    runs, k = [], 0
    while k < lay.cp:
        if real[k]:
            k += 1
            continue
        e = k
        while e < lay.cp and not real[e]:
            e += 1
        runs.append((k, e - k))
        k = e
    return runs


# ---- int16 sources ---------------------------------------------------------------------------------


@dataclass
class Unary16:
    """How a function of an int16 source is computed: vector `passes` over a chunk's buffers "x"
    (the int16 source, overwritten by int16 results), "w" (int16 scratch) and "n" (int8 scratch),
    each (op, a, b, dst, fields) with b None for one-operand passes; the last pass's `dst` holds y.
    `table`: the VLUT's 256 bytes (None without one); `error`: the RMS error in output steps,
    weighted as `table16` says; `zero`: the output code for source 0 (what channel padding becomes)."""

    passes: list[tuple[str, str, str | None, str, dict]]
    table: np.ndarray | None
    error: float
    zero: int
    how: str


def _narrowing(xq: QTensor, c_lo: int, c_hi: int, where: str) -> tuple[dict, float, int]:
    """VMAP fields taking int16 codes to int8 over [c_lo, c_hi] (clamped outside), with the int8
    value's scale and zero point (real = s8 * (x8 - zp8))."""
    span = max(c_hi - c_lo, 2)
    s8 = span * xq.scale / 255.0
    zp8 = int(np.clip(np.rint(-128 - c_lo * xq.scale / s8), -128, 127))
    mult, shift = quant_multiplier(xq.scale / s8, where)
    return dict(mult=mult, shift=shift, zp_in=0, zp_out=zp8, lo=-128, hi=127, src_i16=1), s8, zp8


#: the weight of source code c in a table's error: activations cluster near zero, so errors there
#: count most (a Laplace density whose scale is 1/16 of the int16 range, about an eighth of the
#: calibrated range)
WEIGHT_SCALE = 1 / 16


_TABLE16: dict[tuple, Unary16] = {}  # the compiler lowers a model twice (compile.py): choose once


def table16(values: np.ndarray, xq: QTensor, yq: QTensor, where: str) -> Unary16:
    """The best (least weighted error, `WEIGHT_SCALE`) of the gated and the widened forms of a
    function of an int16 source over a range of narrowing widths; `values` is its real output on
    every int16 code (see the module docstring). Each candidate is simulated bit-exactly."""
    key = (hashlib.sha1(values.tobytes()).digest(), xq.scale, xq.elem, yq.scale, yq.zero_point, yq.elem)
    if key not in _TABLE16:
        if len(_TABLE16) > 1024:
            _TABLE16.clear()
        _TABLE16[key] = _table16(values, xq, yq, where)
    return _TABLE16[key]


def _table16(values: np.ndarray, xq: QTensor, yq: QTensor, where: str) -> Unary16:
    c = codes(xq)
    v = np.nan_to_num(values.astype(np.float64))
    want = np.clip(np.rint(v / yq.scale) + yq.zero_point, yq.qmin, yq.qmax)
    w = np.exp(-np.abs(c) / (WEIGHT_SCALE * xq.qmax))
    w /= w.sum()
    widths = sorted({1 << k for k in range(4, 16)} | {xq.qmax})
    options = _affine(c, v, want, xq, yq, where)
    for r in widths:
        options += [_gated(c, v, want, xq, yq, r, where), _widened(c, v, want, xq, yq, r, where)]
    best = None
    for t, got in (o for o in options if o is not None):
        t.error = float(np.sqrt(np.sum(w * (got - want) ** 2)))
        if best is None or t.error < best.error:
            best = t
    return best


def _fit_clamp_affine(xr: np.ndarray, t: np.ndarray, mask: np.ndarray):
    """(a, b, lo, hi) with clamp(a * x + b, lo, hi) closest to t where `mask` holds (a least-squares
    line through the values strictly between the extremes), or None when there is no such part."""
    lo, hi = float(t[mask].min()), float(t[mask].max())
    span = hi - lo
    inner = mask & (t > lo + 0.01 * span) & (t < hi - 0.01 * span)
    if not span > 0 or inner.sum() < 32:
        return None
    a, b = np.polyfit(xr[inner], t[inner], 1)
    return float(a), float(b), lo, hi


def _affine_add(coef: float, const: float, where: str, **fields) -> dict:
    """VADD fields computing x * coef + const (const in output steps) from a = b = x: (a - 0) * mult_a
    + (b + 1) * mult_b = x * (mult_a + mult_b) + mult_b."""
    big = max(abs(coef), abs(const), 1e-30)
    _, e = math.frexp(big)
    sh = max(0, min(62, 30 - e))
    mb = int(round(const * (1 << sh)))
    ma = int(round(coef * (1 << sh))) - mb
    if max(abs(ma), abs(mb)) >= 1 << 31:
        raise ValueError(f"{where}: affine constants out of range")
    return dict(mult_a=ma, mult_b=mb, shift=sh, zp_a=0, zp_b=-1, **fields)


def _sim_add(x: np.ndarray, f: dict, lo: int, hi: int) -> np.ndarray:
    s_ = f["shift"]
    acc = x * (f["mult_a"] + f["mult_b"]) + f["mult_b"]
    return np.clip(f.get("zp_out", 0) + ((acc + ((1 << s_) >> 1)) >> s_), lo, hi)


def _affine(c, v, want, xq: QTensor, yq: QTensor, where: str) -> list[tuple[Unary16, np.ndarray]]:
    """Piecewise-linear functions exactly, without a table: f = clamp(a x + b, lo, hi) (HardSigmoid,
    Clip, an affine) or f = f(0) + x * clamp(a x + b, lo, hi) (HardSwish and affines of it). The
    clamp runs at a scale of its own whose bounds the int16 clamp holds exactly (0 .. 32767 steps):
    a VADD of the source with itself computes t = clamp(a x + b - lo, 0, hi - lo), then a VADD of t
    with itself (first form) or a VMUL of the source by t (second form) makes y. The line and its
    bounds are fitted on the middle half of the calibrated range (where the quantised graph's own
    intermediate tensors do not saturate); `table16` weighs the result against the tables."""
    xr = c * xq.scale
    calibrated = np.abs(c) <= xq.qmax // 4
    base = 0 if yq.wide else yq.zero_point
    ylo, yhi = (yq.qmin, yq.qmax)
    out = "x" if yq.wide else "n"
    wide = dict(dst_i16=int(yq.wide))
    off = int(np.rint(float(v[c == 0][0]) / yq.scale))
    forms = [("clamp", v, calibrated)]
    nz = np.abs(c) >= 64  # (f - f(0)) / x is noise where x is a few steps
    gate = np.where(c != 0, (v - off * yq.scale) / np.where(c != 0, xr, 1.0), 0.0)
    forms.append(("gate", gate, calibrated & nz))
    found = []
    for form, t, mask in forms:
        fit = _fit_clamp_affine(xr, t, mask)
        if fit is None:
            continue
        a, b, lo, hi = fit
        st = (hi - lo) / 32767  # t's scale: lo at 0, hi at 32767
        try:
            step1 = _affine_add(a * xq.scale / st, (b - lo) / st, where, lo=0, hi=127, dst_i16=1)
            t1 = _sim_add(c, step1, 0, 32767)
            if form == "clamp":
                step2 = _affine_add(st / yq.scale, lo / yq.scale, where, zp_out=base, **wide)
                got = _sim_add(t1, step2, ylo, yhi)
                passes = [("vadd", "x", "x", "w", step1), ("vadd", "w", "w", out, step2)]
                found.append((Unary16(passes, None, 0.0, int(got[c == 0][0]), "clamp (VADD, VADD)"), got))
                continue
            zl = int(np.rint(lo / st))
            if not -128 <= -zl <= 127:
                continue
            passes = [("vadd", "x", "x", "w", step1)]
            if -128 <= base + off <= 127:
                sp, zp_p, k = yq.scale, base + off, None
            else:
                k = -(-(max(abs(int(want.max()) - off), abs(int(want.min()) - off)) + 1) // (yq.qmax + 1))
                sp, zp_p = yq.scale * k, 0
            mult, shift = quant_multiplier(xq.scale * st / sp, where)
            gate = dict(mult=mult, shift=shift, zp_a=0, zp_b=-zl, zp_out=zp_p, **wide)
            got = requant(c * (t1 + zl), mult, shift, zp_p, ylo, yhi)
            passes.append(("vmul", "x", "w", out, gate))
            if k is not None:
                add = _affine_add(k, off, where, zp_out=base, **wide)
                got = _sim_add(got, add, ylo, yhi)
                passes.append(("vadd", out, out, out, add))
        except (ValueError, CompileError):
            continue
        found.append((Unary16(passes, None, 0.0, int(got[c == 0][0]), "clamp gate (VADD, VMUL)"), got))
    return found


def _gated(c, v, want, xq: QTensor, yq: QTensor, r: int, where: str) -> tuple[Unary16, np.ndarray]:
    """y = f(0) + x * g(x) with x narrowed to [-r, r] codes; f(0) is the VMUL's output zero point
    when it fits one (int8 steps), else a VADD of the product with itself adds it (`offset`).
    Returns it with its simulated output codes."""
    base = 0 if yq.wide else yq.zero_point
    off = int(np.rint(float(v[c == 0][0]) / yq.scale))  # f(0) in output steps
    f0 = off * yq.scale
    narrow, s8, zp8 = _narrowing(xq, -r, r, where)
    x8 = requant(c, narrow["mult"], narrow["shift"], zp8, -128, 127)
    # each int8 code's gate: the mean of (f(x) - f(0)) / x over the codes it stands for (least squares)
    nz = c != 0
    num = np.bincount(x8[nz] + 128, (v[nz] - f0) * c[nz] * xq.scale, 256)
    den = np.bincount(x8[nz] + 128, (c[nz] * xq.scale) ** 2, 256)
    g8r = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
    gmin, gmax = float(g8r.min()), float(g8r.max())
    sg = (gmax - gmin) / 255 if gmax > gmin else max(abs(gmax), 1e-30) / 127
    zpg = int(np.clip(np.rint(-128 - gmin / sg), -128, 127)) if gmax > gmin else 0
    t = table(g8r, sg, zpg)
    ylo, yhi = -128, 127
    lo_b, hi_b = (ylo * 256, yhi * 256 + 255) if yq.wide else (ylo, yhi)
    offset = None
    if -128 <= base + off <= 127:
        sp, zp_p = yq.scale, base + off
    else:  # the product at a scale with room for y - f(0), then y = p * k + off (VADD p, p)
        k = -(-(max(abs(int(want.max()) - off), abs(int(want.min()) - off)) + 1) // (yq.qmax + 1))
        sp, zp_p = yq.scale * k, 0
        _, e = math.frexp(abs(off) + k)
        sh = min(62, 30 - e)
        offset = dict(mult_a=(k + off) << sh, mult_b=-off << sh, shift=sh, zp_a=0, zp_b=1, zp_out=base,
                      lo=ylo, hi=yhi, dst_i16=int(yq.wide))  # fmt: skip
    mult, shift = quant_multiplier(xq.scale * sg / sp, where)
    gate = dict(mult=mult, shift=shift, zp_a=0, zp_b=zpg, zp_out=zp_p, lo=ylo, hi=yhi, dst_i16=int(yq.wide))
    got = requant(c * (t[x8 + 128].astype(np.int64) - zpg), mult, shift, zp_p, lo_b, hi_b)
    if offset is not None:  # p * (mult_a + mult_b) - zp_b * mult_b = (p * k + off) << shift
        s_ = offset["shift"]
        acc = got * (offset["mult_a"] + offset["mult_b"]) - offset["mult_b"]
        got = np.clip(base + ((acc + (1 << (s_ - 1))) >> s_), lo_b, hi_b)
    out = "x" if yq.wide else "n"
    passes = [("vmap", "x", None, "n", narrow), ("vlut", "n", None, "n", {}), ("vmul", "x", "n", out, gate)]
    if offset is not None:
        passes.append(("vadd", out, out, out, offset))
    how = "256-entry gate (VMAP, VLUT, VMUL" + (", VADD)" if offset else ")")
    return Unary16(passes, t, 0.0, int(got[~nz][0]), how), got


def _widened(c, v, want, xq: QTensor, yq: QTensor, r: int, where: str) -> tuple[Unary16, np.ndarray]:
    """The table's int8 value of y for x narrowed to [-r, r] codes, then VMAP to y's type."""
    narrow, s8, zp8 = _narrowing(xq, -r, r, where)
    x8 = requant(c, narrow["mult"], narrow["shift"], zp8, -128, 127)
    # each int8 code's value: the mean of f over the codes it stands for
    vt = np.bincount(x8 + 128, v, 256) / np.maximum(np.bincount(x8 + 128, None, 256), 1)
    if yq.wide:
        vmin, vmax = min(float(vt.min()), 0.0), max(float(vt.max()), 0.0)
        st = (vmax - vmin) / 255 if vmax > vmin else 1.0
        zpt = int(np.clip(np.rint(-128 - vmin / st), -128, 127))
        t = table(vt, st, zpt)
        mult, shift = quant_multiplier(st / yq.scale, where)
        widen = dict(mult=mult, shift=shift, zp_in=zpt, zp_out=0, lo=-128, hi=127, dst_i16=1)
        got = requant(t[x8 + 128].astype(np.int64) - zpt, mult, shift, 0, -32768, 32767)
    else:
        t, widen = table(vt, yq.scale, yq.zero_point), None
        got = t[x8 + 128].astype(np.int64)
    passes = [("vmap", "x", None, "n", narrow), ("vlut", "n", None, "n", {})]
    if widen is not None:
        passes.append(("vmap", "n", None, "x", widen))
    return Unary16(passes, t, 0.0, int(got[c == 0][0]), "256-entry table (VMAP, VLUT, VMAP)"), got


def lower(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    lut = plan(ctx)[n.name or n.output[0]]
    x = ctx.acts[lut.source]
    yq = ctx.q_out(n.output[0], n)
    lay = x.layout
    if x.q.wide:
        _lower16(ctx, n, b, lut, x, yq)
        return
    y = ctx.place(yq, f"{ctx.where(n)} output", lay)
    t = table(lut.values, yq.scale, yq.zero_point)
    unit = step_unit(lay)
    pad_runs: list[tuple[int, int]] = []
    # padding channels hold the input's zero point and must hold the output's: fix them unless the
    # table already maps one to the other
    if lay.kind != "dense" and int(t[x.q.zero_point + 128]) != yq.zero_point:
        pad_runs = _pad_runs(lay)
    addr = ctx.const(t.tobytes(), f"{ctx.where(n)} table")
    lut_program(b, ctx.cfg, x.addr, y.addr, x.nbytes, addr, unit, pad_runs, yq.zero_point, ctx.step)
    ctx.op_done(as_reading_source(ctx, n), b, yq.shape, {"split": "256-entry table (VLUT)"})


def _lower16(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder, lut: Lut, x, yq: QTensor) -> None:
    where = ctx.where(n)
    t = table16(lut.values, x.q, yq, where)
    lay = x.layout
    y = ctx.place(yq, f"{where} output", replace(lay, elem=yq.elem))
    pad_runs: list[tuple[int, int]] = []
    if lay.kind != "dense" and t.zero != yq.zero_point:  # channel padding must hold y's zero point
        pad_runs = _pad_runs(lay)
    addr = None if t.table is None else ctx.const(t.table.tobytes(), f"{where} table")
    unit = lay.cp if lay.kind != "dense" else step_unit(replace(lay, elem=1))
    lut16_program(b, ctx.cfg, x.addr, y.addr, lay.nbytes // 2, addr, unit, pad_runs, t.passes, yq, ctx.step)
    how = f"int16 through a {t.how}: error {t.error:.2f} steps"
    ctx.op_done(as_reading_source(ctx, n), b, yq.shape, {"split": how})
