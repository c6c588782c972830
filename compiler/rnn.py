"""Recurrent layers unrolled in the front end: an ONNX LSTM or GRU over a static sequence becomes
the operators its equations are made of, one copy per time step and direction, so that it runs on
the NPU like any other layers: the input projections as one GEMM over the whole sequence per gate,
each step's recurrent projection as a GEMM, the gates as table functions (Sigmoid, Tanh) and
products and sums of two activations, each step's input a view of the projections (a Gather of
one time step), the outputs joined by a Concat.

Unrolled: the default activations, no clip, no peepholes, no `sequence_lens` shorter than the
sequence, layout 0, LSTM without `input_forget`, at most `MAX_STEPS` steps and directions. Any other
recurrent layer stays one host operator (its MACs counted there, compiler/placement.py), with the
reason in the report."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .shapes import inferred_graph

#: the most time steps x directions unrolled: each adds about 30 operators, and the compile time
#: grows faster than the graph (onnxruntime's quantiser, one table per Sigmoid/Tanh: docs/compiler.md)
MAX_STEPS = 32

GATES = {"LSTM": "iofc", "GRU": "zrh"}
DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


def _attrs(n: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


def why_not_unrolled(n: onnx.NodeProto, consts: dict[str, np.ndarray], x_shape) -> str | None:
    """None when `n` (LSTM or GRU) can be unrolled, else why not."""
    a = _attrs(n)
    acts = [s.decode() if isinstance(s, bytes) else s for s in a.get("activations", [])]
    dirs = 2 if a.get("direction", b"forward") in (b"bidirectional", "bidirectional") else 1
    if acts and acts != DEFAULT_ACTS[n.op_type] * dirs:
        return f"activations {acts} other than the default"
    if a.get("clip") is not None:
        return "a cell clip"
    if a.get("layout", 0) != 0:
        return "layout 1 (batch first)"
    if a.get("input_forget", 0):
        return "input_forget"
    named = [i for i in n.input[1:4] if i]
    if any(i not in consts for i in named):
        return "weights that are not constants"
    if len(n.input) > 7 and n.input[7] and np.any(consts.get(n.input[7], 1) != 0):
        return "peephole weights"
    if x_shape is None or len(x_shape) != 3 or not all(isinstance(d, int) and d > 0 for d in x_shape):
        return "an input without a static (seq, batch, features) shape"
    for i in (5, 6):  # initial_h, initial_c: zeros, or tensors the graph computes (streaming state)
        if len(n.input) > i and n.input[i] in consts and np.any(consts[n.input[i]]):
            return "a constant initial state that is not zero"
    if len(n.input) > 4 and n.input[4]:
        lens = consts.get(n.input[4])
        if lens is None or np.any(lens != x_shape[0]):
            return "sequence_lens that are not the whole sequence"
    if x_shape[0] * dirs > MAX_STEPS:
        return f"{x_shape[0]} steps x {dirs} directions, more than the {MAX_STEPS} unrolled"
    return None


class _Writer:
    """New nodes and initializers, named after the recurrent node."""

    def __init__(self, prefix: str):
        self.prefix, self.count = prefix, 0
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def name(self, what: str) -> str:
        self.count += 1
        return f"{self.prefix}/{what}{self.count}"

    def const(self, value: np.ndarray, what: str = "c") -> str:
        name = self.name(what)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op: str, inputs: list[str], what: str | None = None, out: str | None = None, **kw) -> str:
        out = out or self.name(what or op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name(op), **kw))
        return out


def _direction(w: _Writer, kind: str, x: str, steps: int, hidden: int, wd, rd, bd, h0, c0, rev, lbr):
    """One direction's steps: (the step outputs in time order, last h, last c)."""
    f32 = np.float32
    gates = GATES[kind]
    wb, rb = bd[: len(gates) * hidden], bd[len(gates) * hidden :]

    def rows(m, g):
        return m[g * hidden : (g + 1) * hidden]

    # every step's input projection: one GEMM over the sequence per gate (a MatMul of the 3-D
    # input, which the quantiser then quantises); the biases go with the recurrent GEMMs
    # (a GRU's candidate gate takes its input projection step by step, with its bias: its
    # recurrent part is gated by r, so the bias has no GEMM of its own to ride on)
    seq = [name for name in gates if not (kind == "GRU" and name == "h")]
    wt = {name: w.const(rows(wd, g).T.astype(f32), f"W{name}") for g, name in enumerate(gates)}
    proj = {name: w.op("MatMul", [x, wt[name]], f"x{name}") for name in seq}
    bias = {name: rows(wb, g) + (rows(rb, g) if not (kind == "GRU" and name == "h" and lbr) else 0)
            for g, name in enumerate(gates)}  # fmt: skip
    rt = {name: w.const(rows(rd, g).T.astype(f32), f"R{name}") for g, name in enumerate(gates)}

    def first(t: int) -> str:
        """The input at step `t` (2-D): a step whose projection needs its bias added by a Gemm."""
        return w.op("Gather", [x, w.const(np.array(t, np.int64), "t")], "x0", axis=0)

    h, c = h0, c0
    outs: dict[int, str] = {}
    for t in reversed(range(steps)) if rev else range(steps):
        idx = w.const(np.array(t, np.int64), "t")
        xt = {g: w.op("Gather", [proj[g], idx], f"x{g}_t", axis=0) for g in seq}

        def pre(g, h=h, xt=xt, t=t):
            b = w.const(bias[g].astype(f32), f"b{g}")
            if h is None:  # a first step without an initial state: its own projection, with the bias
                return w.op("Add", [w.op("MatMul", [first(t), wt[g]], f"x0{g}"), b], f"p{g}")
            hr = w.op("Add", [w.op("MatMul", [h, rt[g]], f"hr{g}"), b], f"hb{g}")
            return w.op("Add", [xt[g], hr], f"p{g}")

        if kind == "LSTM":
            i, o, f = (w.op("Sigmoid", [pre(g)], g) for g in "iof")
            cc = w.op("Tanh", [pre("c")], "cc")
            ic = w.op("Mul", [i, cc], "ic")
            c = ic if c is None else w.op("Add", [w.op("Mul", [f, c], "fc"), ic], "c")
            h = w.op("Mul", [o, w.op("Tanh", [c], "tc")], "h")
        else:
            z, r = w.op("Sigmoid", [pre("z")], "z"), w.op("Sigmoid", [pre("r")], "r")
            rbh = rows(rb, 2).astype(f32)
            if h is None:  # h0 = 0: the recurrent products vanish (but the reset bias, with lbr)
                rec = w.op("Mul", [r, w.const(rbh, "Rbh")], "rh") if lbr and np.any(rbh) else None
            elif lbr:
                hr = w.op("Add", [w.op("MatMul", [h, rt["h"]], "hrh"), w.const(rbh, "Rbh")], "hrb")
                rec = w.op("Mul", [r, hr], "rh")
            else:
                rec = w.op("MatMul", [w.op("Mul", [r, h], "rh"), rt["h"]], "rhr")
            xin = w.op("MatMul", [first(t), wt["h"]], "xwh")
            xh = w.op("Add", [xin, w.const(bias["h"].astype(f32), "bh")], "xh")
            hh = w.op("Tanh", [xh if rec is None else w.op("Add", [xh, rec], "ph")], "hh")
            keep = w.op("Sub", [w.const(np.array(1.0, f32), "one"), z], "1mz")  # a table of z
            new = w.op("Mul", [keep, hh], "nh")
            h = new if h is None else w.op("Add", [new, w.op("Mul", [z, h], "zh")], "h")
        outs[t] = h
    return [outs[t] for t in range(steps)], h, c


def unroll_recurrent(model: onnx.ModelProto, notes: list[str]) -> None:
    """Every LSTM and GRU that `why_not_unrolled` allows replaced by its steps (module docstring)."""
    g = model.graph
    if not any(n.op_type in GATES and n.domain in ("", "ai.onnx") for n in g.node):
        return
    shapes = {}
    for vi in [*inferred_graph(model).value_info, *g.input]:
        dims = vi.type.tensor_type.shape.dim
        shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    nodes, inits, done = [], [], 0
    for n in g.node:
        why = why_not_unrolled(n, consts, shapes.get(n.input[0])) if n.op_type in GATES else "-"
        if n.op_type in GATES and why is not None:
            notes.append(f"{n.op_type} {n.name or n.output[0]}: kept as one host operator ({why})")
        if why is not None:
            nodes.append(n)
            continue
        w = _Writer(n.name or n.output[0])
        _unroll(w, n, consts, shapes[n.input[0]])
        nodes += w.nodes
        inits += w.inits
        done += 1
    if done:
        del g.node[:]
        g.node.extend(nodes)
        g.initializer.extend(inits)
        notes.append(f"{done} recurrent layers unrolled over their sequences (their steps as NPU operators)")


def _unroll(w: _Writer, n: onnx.NodeProto, consts: dict[str, np.ndarray], x_shape) -> None:
    a = _attrs(n)
    kind, (steps, batch, _) = n.op_type, x_shape
    hidden = int(a["hidden_size"])
    dirs = 2 if a.get("direction", b"forward") in (b"bidirectional", "bidirectional") else 1
    reverse = a.get("direction", b"forward") in (b"reverse", "reverse")
    gates = len(GATES[kind])
    wt, rt = consts[n.input[1]], consts[n.input[2]]
    bias = consts[n.input[3]] if len(n.input) > 3 and n.input[3] else np.zeros((dirs, 2 * gates * hidden))

    def initial(i: int, d: int) -> str | None:
        if len(n.input) <= i or not n.input[i]:
            return None
        src = n.input[i]
        if src in consts and not np.any(consts[src]):
            return None  # zeros: as if absent
        return w.op("Gather", [src, w.const(np.array(d, np.int64), "d")], "init", axis=0)

    ys, hs, cs = [], [], []
    for d in range(dirs):
        seq, h, c = _direction(
            w, kind, n.input[0], steps, hidden, wt[d], rt[d], bias[d],
            initial(5, d), initial(6, d) if kind == "LSTM" else None, reverse or d == 1,
            bool(a.get("linear_before_reset", 0)),
        )  # fmt: skip
        ys.append(seq)
        hs.append(h)
        cs.append(c)
    one = w.const(np.array([1, batch, hidden], np.int64), "shape")
    four = w.const(np.array([steps, 1, batch, hidden], np.int64), "shape")

    def join(values: list[str], shape: str, out: str) -> None:
        """Each value reshaped to `shape` and joined on the first axis into `out`."""
        if len(values) == 1:
            w.op("Reshape", [values[0], shape], out=out)
        else:
            w.op("Concat", [w.op("Reshape", [v, shape], "r") for v in values], out=out, axis=0)

    outs = list(n.output) + [""] * (3 - len(n.output))
    if outs[0]:  # Y: (seq, dirs, batch, hidden): each direction's steps joined, then the directions
        if dirs == 1:
            seq = w.name("seq")
            join(ys[0], one, seq)
            w.op("Reshape", [seq, four], out=outs[0])
        else:
            per = []
            for seq in ys:
                per.append(w.name("seq"))
                join(seq, one, per[-1])
            w.op("Concat", [w.op("Reshape", [y, four], "y4") for y in per], out=outs[0], axis=1)
    if outs[1]:
        join(hs, one, outs[1])
    if outs[2] and kind == "LSTM":
        join(cs, one, outs[2])
