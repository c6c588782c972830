"""1-D convolutions and pooling as 2-D ones of height 1 (the NPU's array and pooling are 2-D).

A sequence tensor (N, C, L) - audio, sensor traces, a TCN's activations - becomes (N, C, 1, L), which
the NPU stores HWC like any feature map (L pixels of C channels). Every 1-D Conv, MaxPool and
AveragePool is rewritten with a (1, k) kernel, and the operators after them that work the same on
the 4-D tensor (element-wise ones, BatchNormalization, Concat, global pools) follow, so a chain of
them stays on the NPU with no reshapes between. Where the region meets the rest of the graph (a
graph input or output, a Transpose, a MatMul) a Reshape converts: those run on the host, which
reorders the bytes between the dense (N, C, L) and the HWC layout. A Flatten, or a Reshape to a
constant shape, reads the 4-D tensor directly (same row-major order). Tensors inside the region are
renamed `<name>__2d`; the names the rest of the graph reads stay.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import Graph, node_attrs

SUFFIX = "__2d"

#: one activation in, one out, shape kept; their other inputs must be one-element constants
UNARY = {
    "Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Selu",
    "Softplus", "Exp", "Log", "Sqrt", "Neg", "Abs", "Floor", "Ceil", "Round", "Erf", "Identity",
    "Reciprocal", "BatchNormalization", "GlobalAveragePool", "GlobalMaxPool",
}  # fmt: skip
#: broadcasting element-wise operators: activations of the region and constants
BINARY = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu", "Sum", "Mean"}
POOLS = ("MaxPool", "AveragePool")


def _is_seq(shapes: dict, name: str) -> bool:
    return len(shapes.get(name, ())) == 3


def _lift_const(c: np.ndarray) -> np.ndarray:
    """A constant that broadcast against (N, C, L) broadcasts the same against (N, C, 1, L)."""
    return c if c.ndim <= 1 else np.expand_dims(c, c.ndim - 1)


def _seed(graph: Graph, shapes: dict, n: onnx.NodeProto) -> bool:
    """A 1-D Conv (weights constant, 3-D) or a 1-D MaxPool/AveragePool, on an (N, C, L) tensor."""
    if not n.input or not _is_seq(shapes, n.input[0]) or n.input[0] in graph.consts:
        return False
    a = node_attrs(n)
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return False
    if n.op_type == "Conv":
        return len(n.input) > 1 and n.input[1] in graph.consts and graph.consts[n.input[1]].ndim == 3
    return n.op_type in POOLS and len(n.output) == 1 and len(a.get("kernel_shape", [])) == 1


def _follows(graph: Graph, shapes: dict, n: onnx.NodeProto, lifted: set[str]) -> bool:
    """An operator that reads a lifted tensor and computes the same on the 4-D view."""
    acts = [i for i in n.input if i and i not in graph.consts]
    if not any(i in lifted for i in acts) or not all(_is_seq(shapes, i) for i in acts):
        return False
    if len(n.output) != 1:
        return False
    if n.op_type in UNARY:
        if n.op_type == "BatchNormalization":
            return acts == [n.input[0]]
        return acts == [n.input[0]] and all(graph.consts[i].size == 1 for i in n.input[1:] if i)
    if n.op_type in BINARY:
        return True
    return n.op_type == "Concat"


def _direct_reader(graph: Graph, n: onnx.NodeProto) -> bool:
    """A Flatten (axis 0-2) or a Reshape to a constant shape without zeros reads the 4-D tensor
    as it would the 3-D one."""
    if n.op_type == "Flatten":
        return node_attrs(n).get("axis", 1) in (0, 1, 2, -1)
    if n.op_type == "Reshape" and n.input[1] in graph.consts:
        return not (graph.consts[n.input[1]] == 0).any()
    return False


def lift_1d(model: onnx.ModelProto, notes: list[str]) -> None:
    """Rewrite `model` in place (see the module docstring); a note says how many nodes moved."""
    if any(n.op_type == "QuantizeLinear" for n in model.graph.node):
        return  # a quantised (QDQ) model keeps its operators where they are
    graph = Graph(model)
    shapes = graph.static_shapes()
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    lifted: set[str] = set()  # original names of the tensors now 4-D
    region: set[int] = set()
    for i, n in enumerate(graph.nodes):
        if _seed(graph, shapes, n) or _follows(graph, shapes, n, lifted):
            region.add(i)
            lifted.update(o for o in n.output[:1] if _is_seq(shapes, o))
    seeds = sum(1 for i in region if graph.nodes[i].op_type in ("Conv", *POOLS))
    if not seeds:
        return
    outputs = set(graph.outputs)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    made: set[str] = set()  # names already created (4-D inputs, reshaped constants, shapes)

    def shape_const(name: str, shape) -> str:
        if name not in made:
            inits.append(numpy_helper.from_array(np.asarray(shape, np.int64), name))
            made.add(name)
        return name

    def to_4d(t: str) -> str:
        """A tensor of the region: lifted (renamed), a constant (reshaped) or a 3-D input (reshaped
        on the way in)."""
        if t in lifted:
            return t + SUFFIX
        if t in graph.consts:
            c = graph.consts[t]
            if c.ndim <= 1:
                return t
            if t + SUFFIX not in made:
                inits.append(numpy_helper.from_array(_lift_const(c), t + SUFFIX))
                made.add(t + SUFFIX)
            return t + SUFFIX
        if t + SUFFIX not in made:
            n_, c_, l_ = shapes[t]
            shp = shape_const(t + SUFFIX + "_shape", [n_, c_, 1, l_])
            nodes.append(helper.make_node("Reshape", [t, shp], [t + SUFFIX], name=t + SUFFIX + "_in"))
            made.add(t + SUFFIX)
        return t + SUFFIX

    for i, n in enumerate(graph.nodes):
        if i in region:
            nodes.append(_lifted_node(graph, n, to_4d))
            for o in n.output[:1]:
                if o not in lifted:
                    continue
                users = graph.consumers.get(o, [])
                back = o in outputs or any(
                    index[id(u)] not in region and not _direct_reader(graph, u) for u in users
                )
                if back:  # the 3-D tensor, for the graph's output and the operators outside
                    shp = shape_const(o + "_shape", list(shapes[o]))
                    nodes.append(helper.make_node("Reshape", [o + SUFFIX, shp], [o], name=o + "_out"))
            continue
        if _direct_reader(graph, n) and n.input[0] in lifted:
            n.input[0] = n.input[0] + SUFFIX
        nodes.append(n)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(inits)
    keep = {v.name for v in model.graph.value_info} - lifted
    vis = [v for v in model.graph.value_info if v.name in keep]
    del model.graph.value_info[:]
    model.graph.value_info.extend(vis)
    notes.append(
        f"{seeds} 1-D convolution{'s' * (seeds > 1)}/pooling{'s' * (seeds > 1)} and "
        f"{len(region) - seeds} operator{'s' * (len(region) - seeds != 1)} after them run as 2-D "
        "of height 1"
    )


def _lifted_node(graph: Graph, n: onnx.NodeProto, to_4d) -> onnx.NodeProto:
    """`n` on 4-D tensors: inputs through `to_4d`, a (1, k) kernel, the Concat axis moved."""
    attrs = node_attrs(n)
    consts = graph.consts
    ins = [to_4d(i) if i and (i not in consts or n.op_type in BINARY) else i for i in n.input]
    if n.op_type == "Conv":
        ins[1] = to_4d(n.input[1])  # (O, I, k) -> (O, I, 1, k)
        attrs.setdefault("kernel_shape", [consts[n.input[1]].shape[2]])
    if n.op_type in ("Conv", *POOLS):
        for key in ("kernel_shape", "strides", "dilations"):
            if key in attrs:
                attrs[key] = [1, *attrs[key]]
        if "pads" in attrs:
            attrs["pads"] = [0, attrs["pads"][0], 0, attrs["pads"][1]]
    if n.op_type == "Concat":
        attrs["axis"] = {0: 0, 1: 1, 2: 3}[attrs.get("axis", 1) % 3]
    return helper.make_node(
        n.op_type, ins, [n.output[0] + SUFFIX], name=n.name, domain=n.domain or None, **attrs
    )
