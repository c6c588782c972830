"""int16 weights as two int8 layers: a float model's matrix operator `y = W x + b` becomes
`y = W_hi x + b` plus `W_lo x`, added.

`W_hi` is `W` rounded to the int8 grid the quantiser gives it (symmetric, its largest magnitude per
output channel or per tensor over 127: `W_hi` has the same largest magnitude, so the quantiser
takes the same scale and `W_hi` is exact in int8), and `W_lo = W - W_hi` (at most half a step of
`W_hi`'s grid) gets its own int8 scale: together about 15 bits of weight. The two layers read the
same input; the NPU runs them as any two layers and an Add (twice the matrix steps and an
element-wise pass), so the model's results are the float model's with finer weights, no new
instruction. The accuracy guard takes this repair where the int8 weights lose a model's accuracy
(docs/real_models.md: the PP-OCRv4 detector on an input it is unsure of).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .errors import CompileError
from .quantize import out_channel_axis
from .shapes import infer_in_place

#: the share of the target's error (1 - target cosine) the int8 weights that stay may take
WEIGHT_SHARE = 0.25
#: float-model MACs (the layers' summed, times the layers, times the feeds) the choice may spend
#: measuring each layer's own loss (one onnxruntime run per layer); above it, fewer feeds, the
#: worst first, and below one feed the layers' output errors alone order them
SENSITIVITY_MACS = 2e10
#: the operators whose constant weights (input 1) split
SPLIT_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
#: suffixes of the names the split makes: the int8 layer keeps the node's name (and its MACs are
#: the model's); the residual's layer and the Add are the repair's own work (`is_residual`)
HI, LO, ADD = "__w_hi", "__w_lo", "__w_add"


def _on_grid(w: np.ndarray, axis: int | None) -> np.ndarray:
    """`w` rounded to the symmetric int8 grid of its largest magnitude (per slice along `axis`, or
    the whole tensor)."""
    if axis is None:
        scale = np.full(w.shape, np.abs(w).max() / 127.0)
    else:
        top = np.moveaxis(np.abs(w), axis, 0).reshape(w.shape[axis], -1).max(axis=1)
        shape = [1] * w.ndim
        shape[axis] = -1
        scale = np.broadcast_to(top.reshape(shape) / 127.0, w.shape)
    safe = np.where(scale > 0, scale, 1.0)
    return np.where(scale > 0, np.round(w / safe) * safe, 0.0)


def split_weights(
    model: onnx.ModelProto, per_channel: bool, nodes: set[str] | None = None
) -> tuple[onnx.ModelProto, list[str]]:
    """`model` with the matrix operators' constant weights split into int8 and residual layers
    (module docstring): those named in `nodes`, or every one. Returns the model (changed in place)
    and the names of the nodes split. `per_channel`: the quantiser's weight scales (one per output
    channel or one per tensor), which `W_hi`'s grid must match."""
    inits = {t.name: t for t in model.graph.initializer}
    if nodes is not None:
        known = {
            n.name
            for n in model.graph.node
            if n.op_type in SPLIT_OPS and n.input[1:2] and n.input[1] in inits
        }
        if set(nodes) - known:
            raise CompileError(
                f"--wide-layer {sorted(set(nodes) - known)[0]}: no matrix operator (Conv, ConvTranspose, "
                f"Gemm, MatMul) of that name with constant weights; there are {len(known)}, e.g. "
                f"{', '.join(sorted(known)[:5])}"
            )
    done: list[str] = []
    made: set[str] = set()
    out: list[onnx.NodeProto] = []
    for n in model.graph.node:
        w_name = n.input[1] if len(n.input) > 1 else ""
        if (
            n.op_type not in SPLIT_OPS
            or w_name not in inits
            or (nodes is not None and n.name not in nodes)
            or inits[w_name].data_type != onnx.TensorProto.FLOAT
        ):
            out.append(n)
            continue
        w = numpy_helper.to_array(inits[w_name]).astype(np.float64)
        if w.ndim < 2 or not np.abs(w).max() > 0:
            out.append(n)
            continue
        hi = _on_grid(w, out_channel_axis(n) % w.ndim if per_channel else None)
        lo = w - hi
        if not np.abs(lo).max() > 0:  # already int8: nothing to add
            out.append(n)
            continue
        base = n.name or n.output[0]
        y = n.output[0]
        hi_w, lo_w = f"{w_name}{HI}", f"{w_name}{LO}"
        if hi_w not in made:  # a weight several operators share is split once
            made.add(hi_w)
            model.graph.initializer.extend(
                [
                    numpy_helper.from_array(hi.astype(np.float32), hi_w),
                    numpy_helper.from_array(lo.astype(np.float32), lo_w),
                ]
            )
        a = onnx.NodeProto()
        a.CopyFrom(n)
        a.name, a.input[1], a.output[0] = base, hi_w, f"{y}{HI}"
        b = onnx.NodeProto()
        b.CopyFrom(n)
        del b.input[2:]  # the bias once, in the int8 layer
        b.name, b.input[1], b.output[0] = f"{base}{LO}", lo_w, f"{y}{LO}"
        if n.op_type == "Gemm":  # alpha scales the product, beta only the bias
            del b.attribute[:]
            b.attribute.extend(at for at in n.attribute if at.name != "beta")
        out += [a, b, helper.make_node("Add", [a.output[0], b.output[0]], [y], name=f"{base}{ADD}")]
        done.append(n.name or y)
    del model.graph.node[:]
    model.graph.node.extend(out)
    used = {i for n in model.graph.node for i in n.input}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    return infer_in_place(model), done


def is_residual(name: str) -> bool:
    """A node the split added (the residual's layer or the Add): not an operator of the model."""
    return name.endswith((LO, ADD))


def choose_wide(
    qdq: onnx.ModelProto,
    float_model: onnx.ModelProto,
    feeds: list[dict],
    want: dict[str, list[np.ndarray]],
    base: np.ndarray,
    errors: dict[str, float],
    costs: dict[str, float],
    target: float,
    macs: float,
    exclude: Collection[str] = (),
) -> list[str]:
    """The layers to give int16 weights: the fewest, in order of loss removed per matrix step added
    (`costs`), that leave the model's loss with the others' int8 weights (`qdq`'s, onnxruntime on
    `feeds` against the float model's outputs `want`) within WEIGHT_SHARE of the target's error on
    the feeds that lose more with every weight int8 (`base`: 1 - each feed's least cosine then).

    The order: each layer's own loss (only its weights int8) on those feeds, where measuring it
    costs at most SENSITIVITY_MACS (`macs`: the model's; else on the worst of them, else each
    layer's output error, `errors`: rounding.weight_errors). Measured because the errors do not say
    what reaches the output: MobileNetV1-0.25's classifier had 82 % of the summed errors and under
    2 % of the loss, its first convolution the most. The count: the shortest prefix of that order
    whose rest is measured within the aim, by bisection (log2 of the layers' runs). `exclude`:
    layers that already have int16 weights (and the residual layers of a split model) are not
    candidates."""
    from .accuracy import output_losses, with_quantised_weights

    names = [n for n in errors if not is_residual(n) and n not in exclude]
    every = {n.name for n in float_model.graph.node}
    aim = WEIGHT_SHARE * (1.0 - target)
    worst = sorted(range(len(feeds)), key=lambda k: -base[k])
    worst = [k for k in worst if base[k] > aim] or worst[:1]

    def loss(quantised: Collection[str], ks: list[int]) -> np.ndarray:
        """Per feed of `ks`, the loss with only the layers `quantised` int8."""
        ref = {o: [w[k] for k in ks] for o, w in want.items()}
        return output_losses(with_quantised_weights(qdq, float_model, quantised), ref, [feeds[k] for k in ks])

    score = {n: errors[n] for n in names}
    keep = int(SENSITIVITY_MACS // (max(macs, 1.0) * max(len(names), 1)))
    if keep >= 1:
        score = {n: float(loss({n}, worst[:keep]).sum()) for n in names}
    order = sorted(names, key=lambda n: (-score[n] / max(costs.get(n, 1.0), 1.0), n))
    lo, hi = 0, len(order)  # a prefix of `lo` layers loses too much; of `hi`, every layer float, none
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if loss(every - set(order[:mid]), worst).max() <= aim:
            hi = mid
        else:
            lo = mid
    return order[:hi]
