"""The front end: an ONNX model as toolchains export it, made into what the compiler's passes read.

In order: initializers listed as graph inputs (IR 3) are taken as constants; opsets older than the
supported one are converted (`onnx.version_converter`); graph inputs
get the static shapes the user gives (`input_shapes`, `--input-shape NAME=1x3x224x224`) and every
input must then be static; constant subgraphs and shapes are folded to a fixpoint (`fold.py`);
`auto_pad` becomes explicit pads; 1-D convolutions and pooling become 2-D ones of height 1
(`lift1d.py`); a channels-last graph input transposed to NCHW is taken as it is
(the NPU's activations are HWC already); a QDQ tensor quantised for several consumers gets one
QuantizeLinear. What was done is listed in `Prepared.notes` (the compile report).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, version_converter

from .control import inline_control_flow
from .fold import fold_constants, refresh_shapes
from .graph import CompileError, Graph, node_attrs
from .lift1d import lift_1d
from .rnn import unroll_recurrent

SUPPORTED_OPSET = 13
NCHW_FROM_NHWC = [0, 3, 1, 2]


class OpsetWarning(UserWarning):
    """The model was converted from an older opset (results may differ where operators changed)."""


@dataclass
class Prepared:
    model: onnx.ModelProto
    notes: list[str] = field(default_factory=list)
    nhwc_inputs: dict[str, tuple[int, ...]] = field(default_factory=dict)  # name -> shape as given


def opset_of(model: onnx.ModelProto) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def prepare(
    model: onnx.ModelProto, source: str, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Prepared:
    """Every front-end step on a loaded, checked model (see the module docstring)."""
    p = Prepared(model)
    constant_inputs(p.model, p.notes)
    p.model = convert_opset(p.model, source, p.notes)
    set_input_shapes(p.model, input_shapes or {}, source)
    check_static_inputs(p.model, source)
    p.model = fold_constants(p.model, source)
    for _ in range(8):  # a nested If or Loop becomes static once the one around it is inlined
        if not inline_control_flow(p.model, source, p.notes):
            break
        p.model = fold_constants(p.model, source)
    unroll_recurrent(p.model, p.notes)
    explicit_pads(p.model, p.notes)
    lift_1d(p.model, p.notes)
    p.nhwc_inputs = fold_input_layout(p.model, p.notes)
    if any(n.op_type == "QuantizeLinear" for n in p.model.graph.node):
        share_quantize(p.model, p.notes)
    p.model = refresh_shapes(p.model)
    check_reshapes(p.model, source)
    return p


# ---- initializers listed as inputs ------------------------------------------------------------------


def constant_inputs(model: onnx.ModelProto, notes: list[str]) -> None:
    """Graph inputs that have an initializer are constants here: IR 3 (the ONNX model zoo's older
    models, Caffe2 exports) lists every initializer as a graph input, and from IR 4 on such an input
    is an overridable default the NPU program fixes at compile time. They leave the input list, so
    later passes that fold or drop initializers (batch normalisation into a convolution) leave no
    dangling inputs behind, and the user feeds only the real inputs."""
    inits = {i.name for i in model.graph.initializer}
    listed = [i for i in model.graph.input if i.name in inits]
    if not listed:
        return
    keep = [i for i in model.graph.input if i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    model.ir_version = max(model.ir_version, 4)  # IR 3 requires initializers among the inputs
    notes.append(f"{len(listed)} initializers listed as graph inputs taken as constants")


# ---- opsets -----------------------------------------------------------------------------------------


def convert_opset(model: onnx.ModelProto, source: str, notes: list[str]) -> onnx.ModelProto:
    """The model at `SUPPORTED_OPSET` when it is older; a CompileError names the file and the opset
    when `onnx.version_converter` has no way (an operator without an adapter, say)."""
    opset = opset_of(model)
    if opset >= SUPPORTED_OPSET:
        return model
    try:
        converted = version_converter.convert_version(model, SUPPORTED_OPSET)
        onnx.checker.check_model(converted)
    except Exception as e:
        # the converter's messages start with a C++ source location; the reason follows "failed: "
        reason = str(e).split("failed: ")[-1].splitlines()[0].strip()
        raise CompileError(
            f"{source}: opset {opset} cannot be converted to the supported opset {SUPPORTED_OPSET} "
            f"({reason}); export the model with opset {SUPPORTED_OPSET} or newer"
        ) from None
    msg = f"opset {opset} converted to opset {SUPPORTED_OPSET} (onnx.version_converter)"
    notes.append(msg)
    warnings.warn(f"{source}: {msg}", OpsetWarning, stacklevel=3)
    return converted


# ---- input shapes -----------------------------------------------------------------------------------


def _graph_inputs(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return {v.name: v for v in model.graph.input if v.name not in inits}


def _dims(v: onnx.ValueInfoProto) -> list[int | str] | None:
    t = v.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]


def set_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], source: str) -> None:
    """Fix the graph inputs' dimensions to `shapes`; the name must be an input and the rank must
    match. A static dimension may only be given its own value."""
    inputs = _graph_inputs(model)
    for name, shape in shapes.items():
        if name not in inputs:
            raise CompileError(
                f"{source}: input shape given for {name!r}, which is not a graph input "
                f"(the inputs are {', '.join(map(repr, inputs))})"
            )
        shape = [int(s) for s in shape]
        if any(s <= 0 for s in shape):
            raise CompileError(f"{source}: input shape {shape} for {name!r}: dimensions must be >= 1")
        dims = _dims(inputs[name])
        if dims is not None and len(dims) != len(shape):
            raise CompileError(
                f"{source}: input {name!r} has rank {len(dims)} (shape {dims}); the shape given, "
                f"{shape}, has rank {len(shape)}"
            )
        for i, (d, s) in enumerate(zip(dims or [], shape, strict=True)):
            if isinstance(d, int) and d > 0 and d != s:
                raise CompileError(
                    f"{source}: input {name!r} has the static dimension {d} at axis {i} (shape {dims}); "
                    f"the shape given, {shape}, has {s}"
                )
        t = inputs[name].type.tensor_type
        t.ClearField("shape")
        t.shape.SetInParent()
        for s in shape:
            t.shape.dim.add().dim_value = s


def check_static_inputs(model: onnx.ModelProto, source: str) -> None:
    """Every graph input static: a dynamic dimension (symbolic, -1, 0, unknown) is an error that
    says which option fixes it."""
    for name, v in _graph_inputs(model).items():
        dims = _dims(v)
        if dims is not None and all(isinstance(d, int) and d > 0 for d in dims):
            continue
        if dims is None:
            raise CompileError(
                f"{source}: graph input {name!r} has no shape; the NPU needs static shapes: give it "
                f"with --input-shape {name}=D1xD2x... (compile_onnx(..., input_shapes={{{name!r}: "
                "(D1, D2, ...)}))"
            )
        # the dimensions to give, by their symbolic names where the exporter named them
        dyn = [d if isinstance(d, str) and d.isidentifier() else f"D{i}" for i, d in enumerate(dims)]
        todo = [dyn[i] for i, d in enumerate(dims) if not (isinstance(d, int) and d > 0)]
        spec = [str(d) if isinstance(d, int) and d > 0 else dyn[i] for i, d in enumerate(dims)]
        zero = any(isinstance(d, int) and d <= 0 for d in dims)
        raise CompileError(
            f"{source}: graph input {name!r} has a dynamic dimension (shape {dims}"
            + ("; 0 and -1 are read as unknown: no tensor of size 0 runs" if zero else "")
            + f"); the NPU needs static shapes: give it with --input-shape {name}={'x'.join(spec)}, "
            f"{', '.join(todo)} as numbers "
            f"(compile_onnx(..., input_shapes={{{name!r}: ({', '.join(spec)})}}))"
        )


# ---- auto_pad ---------------------------------------------------------------------------------------


def explicit_pads(model: onnx.ModelProto, notes: list[str]) -> None:
    """auto_pad (SAME_UPPER, SAME_LOWER, VALID) of Conv and pooling as explicit `pads`, from the
    static input shape (the formula of the ONNX operator definitions)."""
    graph = Graph(model)
    shapes = graph.static_shapes()
    done = 0
    for n in model.graph.node:
        if n.op_type not in ("Conv", "MaxPool", "AveragePool", "LpPool"):
            continue
        a = node_attrs(n)
        mode = a.get("auto_pad", b"NOTSET")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode == "NOTSET" or n.input[0] not in shapes:
            continue
        spatial = shapes[n.input[0]][2:]
        kernel = a.get("kernel_shape")
        if kernel is None and n.op_type == "Conv" and n.input[1] in graph.consts:
            kernel = graph.consts[n.input[1]].shape[2:]
        if kernel is None:
            continue
        strides = a.get("strides", [1] * len(spatial))
        dil = a.get("dilations", [1] * len(spatial))
        begin, end = [], []
        for x, k, s, d in zip(spatial, kernel, strides, dil, strict=True):
            total = 0 if mode == "VALID" else max((math.ceil(x / s) - 1) * s + (k - 1) * d + 1 - x, 0)
            small, large = total // 2, total - total // 2
            begin.append(large if mode == "SAME_LOWER" else small)
            end.append(small if mode == "SAME_LOWER" else large)
        keep = [x for x in n.attribute if x.name not in ("auto_pad", "pads")]
        del n.attribute[:]
        n.attribute.extend([*keep, helper.make_attribute("pads", begin + end)])
        done += 1
    if done:
        notes.append(f"auto_pad made explicit pads on {done} node{'s' * (done > 1)}")


# ---- channels-last inputs ---------------------------------------------------------------------------


def fold_input_layout(model: onnx.ModelProto, notes: list[str]) -> dict[str, tuple[int, ...]]:
    """A 4-D graph input whose only consumers are Transpose(perm=0,3,1,2) is channels-last data made
    NCHW; the NPU stores activations as HWC, so the transpose is folded into the input's layout: the
    graph input becomes the NCHW tensor and the compiled model still takes the NHWC tensor (returned:
    name -> NHWC shape)."""
    g = model.graph
    outputs = {o.name for o in g.output}
    folded = {}
    for name, v in _graph_inputs(model).items():
        users = [n for n in g.node if name in n.input]
        dims = _dims(v)
        if (
            not users
            or name in outputs
            or dims is None
            or len(dims) != 4
            or any(
                n.op_type != "Transpose"
                or list(node_attrs(n).get("perm", [])) != NCHW_FROM_NHWC
                or n.output[0] in outputs
                for n in users
            )
        ):
            continue
        for t in users:
            for n in g.node:
                n.input[:] = [name if x == t.output[0] else x for x in n.input]
        dropped = {id(n) for n in users}
        keep = [n for n in g.node if id(n) not in dropped]
        del g.node[:]
        g.node.extend(keep)
        folded[name] = tuple(int(d) for d in dims)
        nchw = [dims[i] for i in NCHW_FROM_NHWC]
        dst = v.type.tensor_type.shape.dim
        for d, s in zip(dst, nchw, strict=True):
            d.dim_value = int(s)
        notes.append(
            f"input {name!r} {list(dims)} is channels-last: its Transpose to NCHW is folded into the "
            "NPU's HWC input layout (the compiled model takes the tensor as given)"
        )
    return folded


# ---- QDQ models: one QuantizeLinear per tensor ------------------------------------------------------


def _qparams(n: onnx.NodeProto, consts: dict) -> tuple | None:
    ins = list(n.input) + [""] * (3 - len(n.input))
    if ins[1] not in consts or (ins[2] and ins[2] not in consts):
        return None
    zp = consts[ins[2]] if ins[2] else np.zeros((), np.uint8)
    return (consts[ins[1]].tobytes(), str(zp.dtype), zp.tobytes(), node_attrs(n).get("axis", 1))


def share_quantize(model: onnx.ModelProto, notes: list[str]) -> None:
    """A QDQ tensor gets one QuantizeLinear: copies with the same parameters merge; one with other
    parameters requantises the first (DequantizeLinear -> Clip without bounds -> its own
    QuantizeLinear: one VMAP on the NPU). A float tensor that feeds a QuantizeLinear and also other
    consumers or the graph outputs is replaced there by its quantised value (what the NPU holds)."""
    g = model.graph
    graph = Graph(model)
    consts = graph.consts
    outputs = {o.name for o in g.output}
    rename: dict[str, str] = {}
    drop: set[int] = set()
    added: list[onnx.NodeProto] = []
    counts = {"merged": 0, "requantised": 0, "read as quantised by its other consumers": 0}
    by_input: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.nodes:
        if n.op_type == "QuantizeLinear" and n.input[0] not in consts:
            by_input.setdefault(n.input[0], []).append(n)
    for t, qs in by_input.items():
        first, p0 = qs[0], _qparams(qs[0], consts)
        for q in qs[1:]:
            if p0 is not None and _qparams(q, consts) == p0 and q.output[0] not in outputs:
                rename[q.output[0]] = first.output[0]
                drop.add(id(q))
                counts["merged"] += 1
                continue
            dq = _dequantize(first, q.output[0] + "_rq")
            rq = dq.output[0]
            clip = helper.make_node("Clip", [rq], [rq + "_f"], name=rq + "_clip")
            q.input[0] = clip.output[0]
            added += [dq, clip]
            counts["requantised"] += 1
        others = [c for c in graph.consumers.get(t, []) if c.op_type != "QuantizeLinear"]
        if others or t in outputs:
            deq = _dequantize(first, t + "_quantised")
            for c in others:
                c.input[:] = [deq.output[0] if x == t else x for x in c.input]
            if t in outputs:  # the graph output keeps its name and is the dequantised value now
                for n in graph.nodes:
                    n.output[:] = [t + "_float" if x == t else x for x in n.output]
                    if n.op_type == "QuantizeLinear" and n.input[0] == t:
                        n.input[0] = t + "_float"
                deq.output[0] = t
            added.append(deq)
            counts["read as quantised by its other consumers"] += 1
    nodes = [n for n in graph.nodes if id(n) not in drop] + added
    for n in nodes:
        n.input[:] = [rename.get(x, x) for x in n.input]
    del g.node[:]
    g.node.extend(_toposort(nodes, {*graph.consts, *graph.inputs}))
    for what, k in counts.items():
        if k:
            notes.append(f"QDQ: {k} QuantizeLinear {what} (one quantisation per tensor)")


def _dequantize(q: onnx.NodeProto, name: str) -> onnx.NodeProto:
    """A DequantizeLinear of `q`'s output with `q`'s parameters."""
    return helper.make_node("DequantizeLinear", [q.output[0], *q.input[1:]], [name], name=name)


def _toposort(nodes: list[onnx.NodeProto], known: set[str]) -> list[onnx.NodeProto]:
    """`nodes` in an order where every input is produced first (stable: ONNX order where it can)."""
    known, out, rest = set(known) | {""}, [], list(nodes)
    while rest:
        ready = [n for n in rest if all(x in known for x in n.input)]
        if not ready:  # a cycle or an unknown input: keep the rest as it is, the checks name it
            return out + rest
        out.append(ready[0])
        known.update(ready[0].output)
        rest.remove(ready[0])
    return out


# ---- checks after folding ---------------------------------------------------------------------------


def check_reshapes(model: onnx.ModelProto, source: str) -> None:
    """A Reshape's target must be a constant by now: a target still computed at run time (from data,
    not from shapes) cannot give the static shapes the NPU needs, and an empty target is a folding
    error; either is named here rather than failing in the runner."""
    graph = Graph(model, source)
    for n in graph.nodes:
        if n.op_type != "Reshape":
            continue
        target = graph.consts.get(n.input[1])
        if target is None:
            raise CompileError(
                f"{graph.where(n)}: the target shape {n.input[1]!r} is computed at run time from data; "
                "the NPU needs static shapes"
            )
        x = graph.static_shapes().get(n.input[0]) or graph.consts.get(n.input[0], np.empty(0)).shape
        if target.size == 0 and int(np.prod(x)) != 1:
            raise CompileError(f"{graph.where(n)}: empty target shape for an input of shape {list(x)}")
