"""Graph clean-up before quantisation: what a real exported model needs before it can be lowered.

* Identity and inference-mode Dropout are removed;
* constant folding and shape inference to a fixpoint (`fold.py`: Constant, Shape/Size of static
  tensors and any node whose inputs are all constants, evaluated with `onnx.reference`);
* Sum of more than two inputs becomes a chain of Adds;
* BatchNormalization after a Conv, a ConvTranspose or a Gemm is folded into its weights and bias, and so
  is an Add, Sub, Mul or Div of a per-channel (or scalar) constant after a Conv (batch normalisation
  exported as Mul and Add, or a bias kept apart from its convolution);
* MatMul of an activation by a constant, followed by an Add of a constant vector, becomes Gemm (an
  activation of more than two dimensions reshaped to rows and back);
* a Pad of zeros over height and width before a Conv becomes the Conv's padding; a channel shuffle
  or a Slice of channels becomes a Gather of channels (a view on the NPU);
* a BatchNormalization or a per-channel Mul/Add/Sub/Div that no convolution precedes becomes a
  depthwise 1x1 Conv (consecutive ones fold into one).

Activation fusion (Relu/Clip into the preceding Conv/Gemm) is done by the quantiser: onnxruntime
drops a Relu/Clip whose clamp the output quantisation range already gives. A Relu it keeps (after
an int16 tensor), or a Clip at zero whose top the output type saturates at, its producer computes
(`Lowerer.fuse_relu`); any other runs as its own VMAP.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .fold import fold_constants
from .graph import Graph, node_attrs
from .shapes import infer_in_place


def cleanup(model: onnx.ModelProto) -> onnx.ModelProto:
    model = fold_constants(model)
    g = model.graph
    graph = Graph(model)
    consts = dict(graph.consts)
    outputs = set(graph.outputs)
    rename: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []

    def src(name: str) -> str:
        while name in rename:
            name = rename[name]
        return name

    for n in _split_sums(list(g.node)):
        for i, x in enumerate(n.input):
            n.input[i] = src(x) if x else x
        if n.op_type in ("Identity", "Dropout") and n.output[0] not in outputs:
            if n.op_type == "Dropout" and len(n.input) > 2 and n.input[2]:
                training = consts.get(n.input[2])
                if training is None or bool(training):
                    nodes.append(n)
                    continue
            rename[n.output[0]] = n.input[0]
            continue
        nodes.append(n)
    for o in g.output:
        o.name = src(o.name) if o.name in rename else o.name

    nodes = _fold_batchnorm(nodes, consts, outputs)
    nodes = _fold_channel_affine(nodes, consts, outputs)
    nodes = _fold_batchnorm(nodes, consts, outputs)  # a BatchNormalization after a folded bias Add
    _rebuild(model, nodes, consts, outputs)
    shapes = Graph(model).static_shapes()
    nodes = _channel_affine_convs(list(model.graph.node), consts, shapes, first=True)
    nodes = _fold_channel_affine(nodes, consts, outputs)  # the rest of a chain folds into its first
    nodes = _channel_affine_convs(nodes, consts, shapes, first=False)
    _rebuild(model, nodes, consts, outputs)
    # shapes again: folding made Reshape targets constant, so MatMul operands may now be known 2-D
    shapes = Graph(model).static_shapes()
    nodes = _matmul_add_to_gemm(list(model.graph.node), consts, shapes, outputs)
    nodes = _channel_gathers(nodes, consts, shapes, outputs)
    nodes = _pads_into_convs(nodes, consts, outputs)
    _rebuild(model, nodes, consts, outputs)
    return model


def _pads_into_convs(nodes: list, consts: dict, outputs: set[str]) -> list:
    """A Pad of zeros over height and width whose only reader is a Conv (explicit asymmetric or
    'same' padding of PyTorch and TensorFlow exports) becomes the Conv's own padding."""
    cons = _consumers(nodes)
    drop = set()
    for n in nodes:
        readers = cons.get(n.output[0], []) if n.op_type == "Pad" else []
        if len(readers) != 1 or readers[0].op_type != "Conv" or n.output[0] in outputs:
            continue
        conv, a = readers[0], node_attrs(n)
        if a.get("mode", b"constant") not in (b"constant", "constant") or len(n.input) < 2:
            continue
        if n.input[1] not in consts or (len(n.input) > 2 and n.input[2] and n.input[2] not in consts):
            continue
        if len(n.input) > 3 and n.input[3]:  # axes (opset 18)
            continue
        pads = consts[n.input[1]].reshape(-1).astype(int)
        value = float(consts[n.input[2]].reshape(-1)[0]) if len(n.input) > 2 and n.input[2] else 0.0
        ca = node_attrs(conv)
        if value != 0 or len(pads) != 8 or any(pads[[0, 1, 4, 5]]) or (pads < 0).any():
            continue
        if ca.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            continue
        old = list(ca.get("pads", [0, 0, 0, 0]))
        new = [old[0] + pads[2], old[1] + pads[3], old[2] + pads[6], old[3] + pads[7]]
        for attr in list(conv.attribute):
            if attr.name == "pads":
                conv.attribute.remove(attr)
        conv.attribute.append(helper.make_attribute("pads", [int(p) for p in new]))
        conv.input[0] = n.input[0]
        drop.add(id(n))
    return [n for n in nodes if id(n) not in drop]


def _channel_slice(n: onnx.NodeProto, consts: dict, c: int) -> np.ndarray | None:
    """The channels a Slice of a 4-D tensor keeps, when it slices only channels with constant bounds
    and step 1 (None otherwise)."""
    if not all(i in consts for i in n.input[1:] if i):
        return None
    starts, ends = (consts[i].reshape(-1) for i in n.input[1:3])
    axes = consts[n.input[3]].reshape(-1) if len(n.input) > 3 and n.input[3] else np.arange(len(starts))
    steps = consts[n.input[4]].reshape(-1) if len(n.input) > 4 and n.input[4] else np.ones(len(starts))
    if list(axes % 4) != [1] or steps[0] != 1:
        return None
    idx = np.arange(c)[int(np.clip(starts[0], -c, c)) : int(np.clip(ends[0], -c, c))]
    return idx if len(idx) else None


def _channel_gathers(nodes: list, consts: dict, shapes: dict, outputs: set[str]) -> list:
    """A channel shuffle (Reshape (N, C, H, W) -> (N, g, C/g, H, W), Transpose of the middle axes,
    Reshape back) and a Slice of channels (constant bounds, step 1) become a Gather of channels with
    constant indices: a new view of the same bytes on the NPU (compiler/ops/view.py)."""
    cons = _consumers(nodes)
    out, drop = [], set()

    def gather(x: str, idx: np.ndarray, y: str, name: str) -> onnx.NodeProto:
        consts[y + "_channels"] = idx.astype(np.int64)
        return helper.make_node("Gather", [x, y + "_channels"], [y], axis=1, name=name)

    def only(t: str) -> onnx.NodeProto | None:
        c = cons.get(t, [])
        return c[0] if len(c) == 1 and t not in outputs else None

    for n in nodes:
        if id(n) in drop:
            continue
        x = shapes.get(n.input[0]) if n.input else None
        if n.op_type == "Reshape" and x is not None and len(x) == 4 and n.output[0] in shapes:
            mid = shapes[n.output[0]]
            t = only(n.output[0])
            r = only(t.output[0]) if t is not None and t.op_type == "Transpose" else None
            perm = list(node_attrs(t).get("perm", [])) if t is not None else []
            if (
                r is not None and r.op_type == "Reshape" and shapes.get(r.output[0]) == x
                and len(mid) > 4 and mid[0] == x[0] and mid[-2:] == x[2:] and int(np.prod(mid[1:-2])) == x[1]
                and perm[0] == 0 and perm[-2:] == [len(mid) - 2, len(mid) - 1]
            ):  # fmt: skip
                idx = np.arange(x[1]).reshape(mid[1:-2]).transpose([p - 1 for p in perm[1:-2]]).reshape(-1)
                out.append(gather(n.input[0], idx, r.output[0], r.name or n.name))
                drop |= {id(t), id(r)}
                continue
        if n.op_type == "Slice" and x is not None and len(x) == 4:
            idx = _channel_slice(n, consts, x[1])
            if idx is not None:
                out.append(gather(n.input[0], idx, n.output[0], n.name))
                continue
        out.append(n)
    return out


def _split_sums(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """Sum of one input is an Identity, of two an Add, of more a chain of Adds (the NPU adds two
    tensors; each Add gets its own quantisation; onnxruntime's quantiser quantises Add, not Sum, so
    a Sum left as it is would stay float on the host, as old opsets' residual connections did)."""
    out = []
    for n in nodes:
        ins = [x for x in n.input if x]
        if n.op_type != "Sum":
            out.append(n)
            continue
        if len(ins) == 1:
            out.append(helper.make_node("Identity", ins, list(n.output), name=n.name))
            continue
        acc = ins[0]
        for k, x in enumerate(ins[1:], 1):
            last = k == len(ins) - 1
            y = n.output[0] if last else f"{n.output[0]}_sum{k}"
            out.append(helper.make_node("Add", [acc, x], [y], name=n.name if last else f"{n.name}_sum{k}"))
            acc = y
    return out


def _rebuild(model: onnx.ModelProto, nodes: list, consts: dict, outputs: set[str]) -> None:
    g = model.graph
    used = {x for n in nodes for x in n.input} | outputs
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items() if k in used)
    infer_in_place(model, outputs=False)


def _consumers(nodes: list[onnx.NodeProto]) -> dict[str, list[onnx.NodeProto]]:
    cons: dict[str, list] = {}
    for n in nodes:
        for x in n.input:
            cons.setdefault(x, []).append(n)
    return cons


def _fold_batchnorm(nodes: list, consts: dict, outputs: set[str]) -> list:
    cons = _consumers(nodes)
    producers = {o: n for n in nodes for o in n.output}
    drop = set()
    for bn in nodes:
        if bn.op_type != "BatchNormalization" or len(bn.output) != 1:
            continue
        conv = producers.get(bn.input[0])
        if conv is not None and conv.op_type == "Gemm":
            if _fold_batchnorm_into_gemm(bn, conv, consts, cons, outputs):
                drop.add(id(bn))
            continue
        if (
            conv is None
            or conv.op_type not in ("Conv", "ConvTranspose")
            or node_attrs(conv).get("group", 1) != 1
            and conv.op_type == "ConvTranspose"
            or len(cons.get(conv.output[0], [])) != 1
            or conv.output[0] in outputs
            or not all(x in consts for x in list(bn.input[1:5]) + [conv.input[1]])
        ):
            continue
        eps = node_attrs(bn).get("epsilon", 1e-5)
        gamma, beta, mean, var = (consts[x].astype(np.float64) for x in bn.input[1:5])
        w = consts[conv.input[1]].astype(np.float64)
        b = consts[conv.input[2]].astype(np.float64) if len(conv.input) > 2 and conv.input[2] else 0.0
        f = gamma / np.sqrt(var + eps)
        # named after the node, not its weight: a weight two convolutions share folds twice
        wname, bname = conv.output[0] + "_bnfold_weight", conv.output[0] + "_bnfold_bias"
        axis = (1, -1, 1, 1) if conv.op_type == "ConvTranspose" else (-1, 1, 1, 1)  # output channels
        consts[wname] = (w * f.reshape(axis)).astype(np.float32)
        consts[bname] = ((b - mean) * f + beta).astype(np.float32)
        data = conv.input[0]
        del conv.input[:]
        conv.input.extend([data, wname, bname])
        conv.output[0] = bn.output[0]
        drop.add(id(bn))
    return [n for n in nodes if id(n) not in drop]


def _fold_batchnorm_into_gemm(bn, gemm, consts: dict, cons: dict, outputs: set[str]) -> bool:
    """A BatchNormalization of a Gemm's output columns (a dense layer's batch normalisation) into
    the Gemm's weights and bias; False (nothing changed) when it cannot be."""
    a = node_attrs(gemm)
    if (
        a.get("transA", 0)
        or len(cons.get(gemm.output[0], [])) != 1
        or gemm.output[0] in outputs
        or not all(x in consts for x in list(bn.input[1:5]) + [gemm.input[1]])
        or len(gemm.input) > 2
        and gemm.input[2]
        and gemm.input[2] not in consts
    ):
        return False
    eps = node_attrs(bn).get("epsilon", 1e-5)
    gamma, beta, mean, var = (consts[x].astype(np.float64) for x in bn.input[1:5])
    f = gamma / np.sqrt(var + eps)
    w = consts[gemm.input[1]].astype(np.float64) * a.get("alpha", 1.0)
    n = w.shape[0] if a.get("transB", 0) else w.shape[1]
    if f.shape != (n,):
        return False
    c = np.asarray(
        consts[gemm.input[2]].astype(np.float64) * a.get("beta", 1.0)
        if len(gemm.input) > 2 and gemm.input[2]
        else 0.0
    )
    if c.size != 1 and c.shape not in ((n,), (1, n)):
        return False  # a bias per row (M x N, M x 1): not one per output column
    c = np.broadcast_to(c.reshape(-1), (n,))
    # named after the node, not its weight: a weight two Gemms share folds twice
    wname, bname = gemm.output[0] + "_bnfold_weight", gemm.output[0] + "_bnfold_bias"
    consts[wname] = (w * (f[:, None] if a.get("transB", 0) else f[None, :])).astype(np.float32)
    consts[bname] = ((c - mean) * f + beta).astype(np.float32)
    data = gemm.input[0]
    del gemm.input[:]
    gemm.input.extend([data, wname, bname])
    keep = [x for x in gemm.attribute if x.name not in ("alpha", "beta")]
    del gemm.attribute[:]
    gemm.attribute.extend(keep)
    gemm.output[0] = bn.output[0]
    return True


def _channel_vector(c: np.ndarray, channels: int) -> np.ndarray | None:
    """`c` as one value per output channel of an NCHW convolution (None if it is not that)."""
    if c.size == 1:
        return np.full(channels, float(c.reshape(-1)[0]))
    shape = [d for d in c.shape]
    while shape and shape[0] == 1 and len(shape) > 3:
        shape.pop(0)
    if len(shape) == 3 and shape[0] == channels and shape[1:] == [1, 1]:
        return c.reshape(-1).astype(np.float64)
    return None


def _channel_affine_convs(nodes: list, consts: dict, shapes: dict, first: bool) -> list:
    """A BatchNormalization, or a Mul/Add/Sub/Div of an activation by a per-channel constant, that
    no convolution precedes: a depthwise 1x1 Conv (weight and bias per channel; exact in float),
    which the NPU runs (a scalar constant stays a table function, compiler/ops/lut.py). With
    `first`, only the first of a chain (the rest then folds into it), else every one left."""
    producers = {o: n.op_type for n in nodes for o in n.output}
    chain = ("Conv", "ConvTranspose", "BatchNormalization", "Mul", "Add", "Sub", "Div")
    out = []
    for n in nodes:
        x = n.input[0] if n.input else ""
        if first and producers.get(x) in chain:
            out.append(n)
            continue
        shape = shapes.get(x)
        if shape is None or len(shape) != 4 or x in consts:
            out.append(n)
            continue
        c = shape[1]
        scale = shift = None
        params = n.input[1:5]
        if n.op_type == "BatchNormalization" and len(n.output) == 1 and all(i in consts for i in params):
            gamma, beta, mean, var = (consts[i].astype(np.float64).reshape(-1) for i in params)
            scale = gamma / np.sqrt(var + node_attrs(n).get("epsilon", 1e-5))
            shift = beta - mean * scale
        elif n.op_type in ("Mul", "Add", "Sub", "Div") and len(n.input) == 2 and n.input[1] in consts:
            v = consts[n.input[1]]
            vec = _channel_vector(np.asarray(v), c) if v.size > 1 else None
            if vec is not None and not (n.op_type == "Div" and np.any(vec == 0)):
                ones, zeros = np.ones(c), np.zeros(c)
                scale, shift = {"Mul": (vec, zeros), "Div": (1 / vec, zeros),
                                "Add": (ones, vec), "Sub": (ones, -vec)}[n.op_type]  # fmt: skip
        if scale is None:
            out.append(n)
            continue
        w, b = n.output[0] + "_dw_w", n.output[0] + "_dw_b"
        consts[w] = scale.reshape(c, 1, 1, 1).astype(np.float32)
        consts[b] = np.asarray(shift, np.float64).reshape(-1).astype(np.float32)
        out.append(helper.make_node("Conv", [x, w, b], [n.output[0]], group=c, kernel_shape=[1, 1],
                                    name=n.name or n.output[0]))  # fmt: skip
    return out


def _fold_channel_affine(nodes: list, consts: dict, outputs: set[str]) -> list:
    """conv(x) + c, conv(x) - c, conv(x) * c, conv(x) / c with c constant per output channel (conv a
    Conv or an ungrouped ConvTranspose): the same convolution with scaled weights and a shifted bias
    (exact in float), until none is left."""
    while True:
        cons = _consumers(nodes)
        producers = {o: n for n in nodes for o in n.output}
        drop = set()
        for n in nodes:
            if n.op_type not in ("Add", "Sub", "Mul", "Div") or len(n.input) != 2 or id(n) in drop:
                continue
            for k in (0, 1):
                conv, c = producers.get(n.input[k]), consts.get(n.input[1 - k])
                if (
                    conv is None or c is None or id(conv) in drop
                    or conv.op_type not in ("Conv", "ConvTranspose")
                    or (conv.op_type == "ConvTranspose" and node_attrs(conv).get("group", 1) != 1)
                    or len(cons.get(conv.output[0], [])) != 1 or conv.output[0] in outputs
                    or conv.input[1] not in consts or (len(conv.input) > 2 and conv.input[2] not in consts)
                    or (k == 1 and n.op_type in ("Sub", "Div"))  # c - conv, c / conv: not affine in conv
                ):  # fmt: skip
                    continue
                w = consts[conv.input[1]].astype(np.float64)
                axis = 1 if conv.op_type == "ConvTranspose" else 0  # the weights' output channels
                v = _channel_vector(np.asarray(c), w.shape[axis])
                if v is None or (n.op_type == "Div" and np.any(v == 0)):
                    continue
                b = consts[conv.input[2]].astype(np.float64) if len(conv.input) > 2 and conv.input[2] else 0.0
                if n.op_type in ("Mul", "Div"):
                    f = v if n.op_type == "Mul" else 1 / v
                    w, b = w * f.reshape([-1 if d == axis else 1 for d in range(4)]), b * f
                else:
                    b = b + (v if n.op_type == "Add" else -v)
                wname, bname = n.output[0] + "_fold_w", n.output[0] + "_fold_b"
                consts[wname] = w.astype(np.float32)
                consts[bname] = np.broadcast_to(b, (w.shape[axis],)).astype(np.float32)
                data = conv.input[0]
                del conv.input[:]
                conv.input.extend([data, wname, bname])
                conv.output[0] = n.output[0]
                drop.add(id(n))
                break
        if not drop:
            return nodes
        nodes = [n for n in nodes if id(n) not in drop]


def _matmul_add_to_gemm(nodes: list, consts: dict, shapes: dict, outputs: set[str]) -> list:
    cons = _consumers(nodes)
    out = []
    drop = set()
    for n in nodes:
        if id(n) in drop:
            continue
        if n.op_type == "MatMul" and n.input[1] in consts and consts[n.input[1]].ndim == 2:
            a_shape = shapes.get(n.input[0])
            users = cons.get(n.output[0], [])
            static = a_shape is not None and len(a_shape) >= 2
            static = static and all(isinstance(d, int) and d > 0 for d in a_shape)
            if static and len(users) == 1 and n.output[0] not in outputs:
                add = users[0]
                other = ""
                if add.op_type == "Add":
                    other = add.input[1] if add.input[0] == n.output[0] else add.input[0]
                if (
                    add.op_type == "Add"
                    and other in consts
                    and consts[other].size == consts[n.input[1]].shape[1]
                ):
                    consts[other + "_gemm_bias"] = consts[other].reshape(-1).astype(np.float32)
                    name = n.name or add.name
                    a, y = n.input[0], add.output[0]
                    if len(a_shape) > 2:  # Gemm is 2-D: the leading dimensions as rows, reshaped back
                        k, cols = a_shape[-1], consts[n.input[1]].shape[1]
                        consts[f"{name}_rows"] = np.array([-1, k], np.int64)
                        consts[f"{name}_back"] = np.array([*a_shape[:-1], cols], np.int64)
                        flat = f"{name}_2d"
                        out.append(helper.make_node("Reshape", [a, f"{name}_rows"], [flat], name=flat))
                        a, y = flat, f"{name}_gemm"
                    bias = other + "_gemm_bias"
                    out.append(helper.make_node("Gemm", [a, n.input[1], bias], [y], name=name))
                    if y != add.output[0]:
                        out.append(helper.make_node("Reshape", [y, f"{name}_back"], [add.output[0]],
                                                    name=f"{name}_back"))  # fmt: skip
                    drop.add(id(add))
                    continue
        out.append(n)
    return [n for n in out if id(n) not in drop]
