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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from npu.isa import LUT_BYTES
from npu.program import ProgramBuilder

from ..elementwise import lut_program, step_unit
from ..graph import node_attrs

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


def _dequant(scale: float, zp: int) -> np.ndarray:
    return ((CODES - zp).astype(np.float32) * np.float32(scale)).astype(np.float32)


def _fake_quant(v: np.ndarray, scale: float, zp: int) -> np.ndarray:
    """QuantizeLinear then DequantizeLinear, as the int8 graph rounds (half to even, saturating)."""
    q = table(v, scale, zp).astype(np.int64)
    return (q - zp).astype(np.float32) * np.float32(scale)


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
            out = [(q, _dequant(qt.scale, qt.zero_point))]
            qn = ctx.graph.producers.get(q)
            if qn is not None and qn.op_type == "QuantizeLinear":
                for src, v in self.options(qn.input[0], depth + 1):
                    out.append((src, _fake_quant(v, qt.scale, qt.zero_point)))
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
    inputs = [helper.make_tensor_value_info(names[k], onnx.TensorProto.FLOAT, [LUT_BYTES]) for k in acts]
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
    if getattr(ctx, "_lut_plan", None) is not None:
        return ctx._lut_plan
    tr = _Tracer(ctx)
    out = {}
    for n in ctx.graph.nodes:
        if n.op_type not in OPS or n.domain not in ("", "ai.onnx") or len(n.output) != 1 or _own_rule(ctx, n):
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


def check(ctx: Lowerer, n: onnx.NodeProto) -> str | None:
    if (n.name or n.output[0]) in plan(ctx):
        return None
    return (
        "not a function of one int8 activation and scalar constants, or its output does not feed "
        "exactly one QuantizeLinear"
    )


def table(values: np.ndarray, scale: float, zp: int) -> np.ndarray:
    """The int8 table: `values` quantised to the output's scale (NaN: the zero point)."""
    q = np.clip(np.rint(values.astype(np.float32) / np.float32(scale)) + zp, -128, 127)
    return np.where(np.isnan(values), zp, q).astype(np.int8)


def lower(ctx: Lowerer, n: onnx.NodeProto, b: ProgramBuilder) -> None:
    lut = plan(ctx)[n.name or n.output[0]]
    x = ctx.acts[lut.source]
    yq = ctx.q_out(n.output[0], n)
    lay = x.layout
    y = ctx.place(yq, f"{ctx.where(n)} output", lay)
    t = table(lut.values, yq.scale, yq.zero_point)
    unit = step_unit(lay)
    pad_runs: list[tuple[int, int]] = []
    # padding channels hold the input's zero point and must hold the output's: fix them unless the
    # table already maps one to the other
    if lay.kind != "dense" and int(t[x.q.zero_point + 128]) != yq.zero_point:
        real = np.zeros(lay.cp, bool)
        real[list(lay.chan)] = True
        k = 0
        while k < lay.cp:
            if real[k]:
                k += 1
                continue
            e = k
            while e < lay.cp and not real[e]:
                e += 1
            pad_runs.append((k, e - k))
            k = e
    addr = ctx.const(t.tobytes(), f"{ctx.where(n)} table")
    lut_program(b, ctx.cfg, x.addr, y.addr, x.nbytes, addr, unit, pad_runs, yq.zero_point, ctx.step)
    # the fragment reads the source (the nodes between are absorbed or run on their own)
    src_node = helper.make_node(n.op_type, [lut.source], list(n.output), name=n.name)
    ctx.op_done(src_node, b, yq.shape, {"split": "256-entry table (VLUT)"})
