"""Control flow in the front end: the NPU runs straight-line programs, so an `If` whose condition is
a constant becomes the branch it takes, and a `Loop` with a constant trip count whose condition
stays true is unrolled (its carried values chained, its scan outputs concatenated). Any other
`If`, `Loop` or `Scan` is a CompileError naming the node and what would make it static."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import CompileError

#: the most iterations a Loop is unrolled to (each copies its body into the graph)
MAX_UNROLL = 1024


def _constants(g: onnx.GraphProto) -> dict[str, np.ndarray]:
    out = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def _local_names(body: onnx.GraphProto) -> set[str]:
    names = {t.name for t in body.initializer} | {i.name for i in body.input}
    return names | {o for n in body.node for o in n.output if o}


def _copy(body: onnx.GraphProto, rename: dict[str, str], prefix: str, out: list, inits: list) -> None:
    """`body`'s nodes and initializers appended to `out`/`inits` with its local names renamed."""
    for t in body.initializer:
        c = onnx.TensorProto()
        c.CopyFrom(t)
        c.name = rename[t.name]
        inits.append(c)
    for n in body.node:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        c.name = prefix + (n.name or n.op_type)
        c.input[:] = [rename.get(i, i) for i in n.input]
        c.output[:] = [rename.get(o, o) for o in n.output]
        out.append(c)


def _stays_true(body: onnx.GraphProto) -> bool:
    """The body's condition output is its condition input passed through, or a true constant."""
    cond_in, cond_out = body.input[1].name, body.output[0].name
    if cond_out == cond_in:
        return True
    if any(n.op_type == "Identity" and n.input[0] == cond_in and n.output[0] == cond_out for n in body.node):
        return True
    consts = _constants(body)
    return cond_out in consts and bool(np.all(consts[cond_out]))


def _if(n: onnx.NodeProto, cond: bool, out: list, inits: list) -> None:
    attrs = {a.name: a.g for a in n.attribute}
    branch = attrs["then_branch" if cond else "else_branch"]
    prefix = f"{n.name}/{'then' if cond else 'else'}/"
    rename = {x: prefix + x for x in _local_names(branch)}
    _copy(branch, rename, prefix, out, inits)
    for o, b in zip(n.output, branch.output, strict=True):
        out.append(helper.make_node("Identity", [rename.get(b.name, b.name)], [o], name=prefix + "out/" + o))


def _loop(n: onnx.NodeProto, trips: int, source: str, out: list, inits: list) -> None:
    body = next(a.g for a in n.attribute if a.name == "body")
    n_carried = len(n.input) - 2
    carried = list(n.input[2:])
    scans: list[list[str]] = [[] for _ in range(len(body.output) - 1 - n_carried)]
    for i in range(trips):
        prefix = f"{n.name}/iter{i}/"
        rename = {x: prefix + x for x in _local_names(body)}
        inits.append(numpy_helper.from_array(np.array(i, np.int64), rename[body.input[0].name]))
        inits.append(numpy_helper.from_array(np.array(True), rename[body.input[1].name]))
        for v, name in zip(body.input[2:], carried, strict=True):
            rename[v.name] = name
        _copy(body, rename, prefix, out, inits)
        carried = [rename.get(o.name, o.name) for o in body.output[1 : 1 + n_carried]]
        for j, o in enumerate(body.output[1 + n_carried :]):
            scans[j].append(rename.get(o.name, o.name))
    for o, c in zip(n.output[:n_carried], carried, strict=True):
        out.append(helper.make_node("Identity", [c], [o], name=f"{n.name}/out/{o}"))
    axes = f"{n.name}/axes0"
    if scans:
        inits.append(numpy_helper.from_array(np.array([0], np.int64), axes))
    for o, parts in zip(n.output[n_carried:], scans, strict=True):
        ups = []
        for k, p in enumerate(parts):
            ups.append(f"{n.name}/scan/{o}/{k}")
            out.append(helper.make_node("Unsqueeze", [p, axes], [ups[-1]], name=ups[-1]))
        out.append(helper.make_node("Concat", ups, [o], name=f"{n.name}/scan/{o}", axis=0))


def inline_control_flow(model: onnx.ModelProto, source: str, notes: list[str]) -> bool:
    """Replace the static If and Loop nodes of the main graph (module docstring); True when any
    changed (the caller folds constants again, which may make nested ones static)."""
    g = model.graph
    consts = _constants(g)
    out: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    changed = False
    for n in g.node:
        where = f"{source}: node {n.name!r} ({n.op_type})"
        if n.op_type == "If" and n.input[0] in consts:
            cond = bool(np.all(consts[n.input[0]]))
            _if(n, cond, out, inits)
            notes.append(f"If {n.name}: its condition is constant ({cond}), that branch taken")
            changed = True
        elif n.op_type == "Loop":
            m = consts.get(n.input[0]) if n.input[0] else None
            cond_ok = not n.input[1] or (n.input[1] in consts and bool(np.all(consts[n.input[1]])))
            body = next(a.g for a in n.attribute if a.name == "body")
            if m is None or not cond_ok or not _stays_true(body):
                why = (
                    "its trip count is not a constant" if m is None
                    else "its condition may end it early (the NPU needs a static number of iterations)"
                )  # fmt: skip
                raise CompileError(
                    f"{where}: a loop is unrolled only with a constant trip count and a condition that "
                    f"stays true; {why}. Export it unrolled (a fixed sequence length) or fix "
                    "the input shapes (--input-shape) so the trip count folds"
                )
            trips = int(m)
            if not 0 < trips <= MAX_UNROLL:
                raise CompileError(
                    f"{where}: a trip count of {trips} (unrolled: 1 to {MAX_UNROLL} iterations)"
                )
            _loop(n, trips, source, out, inits)
            notes.append(f"Loop {n.name}: unrolled {trips} times")
            changed = True
        elif n.op_type in ("If", "Scan"):
            what = "its condition is not a constant" if n.op_type == "If" else "Scan is not supported"
            raise CompileError(
                f"{where}: control flow runs only when it is static: {what}. Export the model with "
                "the branch or sequence fixed, or fix the input shapes (--input-shape) so it folds"
            )
        else:
            out.append(n)
    if changed:
        del g.node[:]
        g.node.extend(out)
        g.initializer.extend(inits)
    return changed
