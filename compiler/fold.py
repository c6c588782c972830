"""Constant folding and shape inference, repeated until nothing changes.

Exporters compute shapes at run time: Shape -> Gather/Slice/Cast -> Concat -> Reshape, Unsqueeze,
ConstantOfShape, Range, Size... Once the graph inputs have static shapes these subgraphs are
constants. One pass is not enough: a Reshape whose target just became constant gives its output a
static shape only at the next shape inference, and a Shape of that output can fold only then. So
the two alternate to a fixpoint; every value is evaluated by `onnx.reference` (the operators' own
definitions, not hand-written copies).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from .graph import CompileError, Graph, node_attrs
from .shapes import copied, infer_in_place

# never folded: quantisation nodes keep a QDQ model's structure, random operators their meaning
KEEP = {"QuantizeLinear", "DequantizeLinear"}
RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}
RANDOM |= {"Bernoulli", "Dropout"}  # Dropout: only cleanup decides whether it is in inference mode
MAX_ROUNDS = 16


def refresh_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shapes inferred afresh: stale intermediate shapes and symbolic output shapes are dropped first
    (an exporter's `['N', 1000]` output would otherwise hide the inferred `[1, 1000]`)."""
    model = copied(model)
    g = model.graph
    del g.value_info[:]
    for o in g.output:
        dims = o.type.tensor_type.shape.dim
        if not all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
            o.type.tensor_type.ClearField("shape")
    return infer_in_place(model, data_prop=True)


def fold_constants(model: onnx.ModelProto, source: str = "model") -> onnx.ModelProto:
    """Fold every constant subgraph (Constant, Shape/Size of static tensors, nodes whose inputs are
    all constant) and refresh shapes, until a round folds nothing. The result has inferred shapes."""
    model = refresh_shapes(model)
    for _ in range(MAX_ROUNDS):
        model, changed = _fold_once(model, source)
        model = refresh_shapes(model)
        if not changed:
            break
    return model


def _fold_once(model: onnx.ModelProto, source: str) -> tuple[onnx.ModelProto, bool]:
    graph = Graph(model, source)
    consts = dict(graph.consts)
    shapes = graph.static_shapes()
    outputs = set(graph.outputs)
    nodes: list[onnx.NodeProto] = []
    changed = False
    for n in graph.nodes:
        value = _evaluate(n, consts, shapes, model, graph)
        if value is None or any(o in outputs for o in n.output):
            nodes.append(n)
            continue
        for name, v in zip([o for o in n.output if o], value, strict=True):
            consts[name] = np.asarray(v)
        changed = True
    if not changed:
        return model, False
    used = {x for n in nodes for x in _reads(n)} | outputs
    g = model.graph
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items() if k in used)
    # a graph input that was only an initializer's default stays an initializer
    keep_inputs = [i for i in g.input if i.name not in graph.consts or i.name in used]
    del g.input[:]
    g.input.extend(keep_inputs)
    # IR 3 wants every initializer listed as a graph input; from IR 4 on they need not be
    model.ir_version = max(model.ir_version, 4)
    return model, True


def _reads(n: onnx.NodeProto) -> set[str]:
    """The names a node reads, including those its subgraphs (If/Loop bodies) take from outside."""
    names = set(n.input)
    for a in n.attribute:
        for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
            for m in sub.node:
                names |= _reads(m)
    return names


def _evaluate(
    n: onnx.NodeProto, consts: dict, shapes: dict, model: onnx.ModelProto, graph: Graph
) -> list | None:
    """The node's output values when they are known before run time, else None."""
    if n.domain not in ("", "ai.onnx") or n.op_type in KEEP | RANDOM:
        return None
    if any(x.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for x in n.attribute):
        return None  # If/Loop/Scan: control.py inlines the static ones
    a = node_attrs(n)
    if n.op_type == "Shape" and n.input[0] in shapes:
        s = np.array(shapes[n.input[0]], np.int64)
        return [s[a.get("start", 0) : a.get("end", len(s))]]
    if n.op_type == "Size" and n.input[0] in shapes:
        return [np.array(int(np.prod(shapes[n.input[0]])), np.int64)]
    ins = [x for x in n.input if x]
    if n.op_type != "Constant" and not (ins and all(x in consts for x in ins)):
        return None
    try:
        return ReferenceEvaluator(_single_node_model(n, consts, model)).run(None, {})
    except Exception as e:  # a constant subgraph that cannot be evaluated is the model's error
        raise CompileError(f"{graph.where(n)}: cannot evaluate this constant subgraph ({e})") from None


def _single_node_model(n: onnx.NodeProto, consts: dict, model: onnx.ModelProto) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(consts[x], x) for x in dict.fromkeys(n.input) if x]
    outs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in n.output if o]
    g = helper.make_graph([n], "fold", [], outs, inits)
    m = helper.make_model(g, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    return m
