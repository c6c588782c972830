"""Graph outputs at full precision: a Gemm, MatMul or Conv whose quantised result is read only as a
graph output or by host operators (a classifier's logits before a host Softmax, a detector's box
regression) stores its int32 accumulators instead of int8, dequantised on the host with one scale
per column or channel (input scale x weight scale); a host operator's result read the same way
(the Softmax's probabilities) stays float instead of going through int8, and so does a Concat's,
which moves to the host so that branches of different scales keep their own, and a Reshape's (or
Flatten's, Squeeze's, Unsqueeze's) of such a result on its way to the output.

An int8 output scale is calibrated on sample inputs: values beyond the calibrated range saturate
and every value is rounded to 1/255 of the range, which moves softmax probabilities where logits
are close. The accumulators hold the exact integer dot products, so the output is the float value
of the quantised graph without its final rounding (onnxruntime computes the same graph with the
QuantizeLinear/DequantizeLinear pair removed, the oracle of the tests).
"""

from __future__ import annotations

import onnx

from .graph import Graph
from .ops.registry import WIDE_OPS

# operators without MACs that move to the host when only the host reads their result, so that
# their inputs can stay int32 or float (a detector's Concat of box and class branches of different
# scales; a classifier's Softmax -> Reshape or Flatten as the graph output)
MOVABLE = ("Concat", "Reshape", "Flatten", "Squeeze", "Unsqueeze")
VIEWS = MOVABLE[1:]  # these move only when what they reshape can then stay wide or float


def _host_only(op: onnx.NodeProto) -> bool:
    """True when no NPU lowering exists for the operator (it can only run on the host)."""
    from .ops.registry import RULES

    return op.domain not in ("", "ai.onnx") or op.op_type not in RULES


def clamped_by_quantisation(model: onnx.ModelProto) -> set[str]:
    """The nodes of a float model whose result goes only into a Relu or Clip: onnxruntime's
    quantiser removes such an activation and lets the output's int8 range clamp instead, so their
    QuantizeLinear must stay (the names survive quantisation)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    return {
        n.name
        for n in model.graph.node
        if n.output and len(r := readers.get(n.output[0], [])) == 1 and r[0].op_type in ("Relu", "Clip")
    }


def _widens(g: Graph, view: onnx.NodeProto, on_host) -> bool:
    """Whether moving a reshaping `view` to the host lets its input stay wide or float: the input
    is a dequantised result of a host operator or of a Gemm/MatMul/Conv."""
    dq = g.producers.get(view.input[0])
    q = g.producers.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
    p = g.producers.get(q.input[0]) if q is not None and q.op_type == "QuantizeLinear" else None
    return p is not None and (on_host(p) or p.op_type in WIDE_OPS)


def keep_output_precision(
    model: onnx.ModelProto,
    source: str = "model",
    host: set[str] | None = None,
    clamped: set[str] = frozenset(),
) -> list[tuple[str, str]]:
    """Remove the QuantizeLinear/DequantizeLinear pair after every Gemm/MatMul/Conv and every host
    operator whose dequantised value is only a graph output or an input of host operators: the
    lowering then stores the Gemm's or Conv's int32 accumulators (compiler/ops/gemm.py, conv.py),
    and a host operator's result stays float. A Concat read that way moves to the host as well, so
    that its inputs keep their own scales. `host`: the nodes a lowering placed on the host (by
    name; default: the operators without an NPU lowering), so that a second pass after lowering
    also covers host operators whose NPU lowering did not apply (a Reshape that moves data).
    `clamped` (`clamped_by_quantisation` of the float model) are left as they are.
    Returns (what, how) for each value kept so; `model` is changed in place."""
    from . import ops  # noqa: F401 - registers the NPU's operators

    g = Graph(model, source)
    outputs = set(g.outputs)
    drop: list[onnx.NodeProto] = []
    kept = []
    moved: set[str] = set()  # Concats moved to the host by this pass

    def on_host(n: onnx.NodeProto) -> bool:
        return n.name in moved or (n.name in host if host is not None else _host_only(n))

    for n in reversed(g.nodes):  # readers before producers: a moved Concat frees its inputs
        # a host result stays float; a Concat may move to the host; a Gemm/Conv result stays int32
        kind = "host" if on_host(n) else "movable" if n.op_type in MOVABLE else ""
        kind = kind or ("wide" if n.op_type in WIDE_OPS else "")
        if not kind or not n.output or not n.output[0] or n.name in clamped:
            continue
        qs = g.consumers.get(n.output[0], [])
        if len(qs) != 1 or qs[0].op_type != "QuantizeLinear" or n.output[0] in outputs:
            continue
        dqs = g.consumers.get(qs[0].output[0], [])
        if len(dqs) != 1 or dqs[0].op_type != "DequantizeLinear" or qs[0].output[0] in outputs:
            continue
        val = dqs[0].output[0]
        readers = g.consumers.get(val, [])
        if not (val in outputs or readers) or not all(on_host(c) for c in readers):
            continue
        if kind == "wide":
            try:
                if len(g.shape(n.output[0], source)) != WIDE_OPS[n.op_type]:
                    continue
            except Exception:  # no static shape: leave the node as it is
                continue
        if kind == "movable" and n.op_type in VIEWS and not _widens(g, n, on_host):
            continue
        if kind == "movable":
            moved.add(n.name)
        n.output[0] = val  # the node now computes the dequantised value itself
        drop += [qs[0], dqs[0]]
        what = f"output {val}" if val in outputs else f"{val} (read on the host)"
        how = "int32 accumulators, one scale per channel" if kind == "wide" else "float (host)"
        kept.append((what, how))
    if drop:
        ids = {id(d) for d in drop}
        keep = [n for n in model.graph.node if id(n) not in ids]
        del model.graph.node[:]
        model.graph.node.extend(keep)
    return kept[::-1]
