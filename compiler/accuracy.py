"""The accuracy guard: a compiled float model is run (golden model) against onnxruntime running the
float model on check samples, and its cosine per output compared with a target.

* Check samples: with at least `HOLD_BACK_FROM` calibration batches, the last `CHECK_BATCHES` are
  held back from calibration (data the quantiser never saw); with fewer, the first ones are used in
  sample (the report says which).
* Below the target, the operators losing the most accuracy are found by running the quantised
  (QDQ) model and the float model in onnxruntime with every intermediate tensor exposed: a node's
  loss is the cosine of its inputs (as quantised) minus the cosine of its result, both against
  float. The worst node (if on the NPU) and the NPU nodes whose quantised results it reads move to
  the host, where results read only by the host
  stay float (compiler/outputs.py) - a logarithm of a quantised power spectrum is the typical
  case - and the model is checked again; if that does not reach the target, the compile fails
  with `AccuracyError` naming the worst operators.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import AccuracyError
from .graph import Graph
from .ops.registry import is_fused
from .quantize import ort_session
from .shapes import copied

#: calibration batches from which the check samples are held back rather than reused
HOLD_BACK_FROM = 8
#: batches the check runs (each costs one golden-model run and one onnxruntime run)
CHECK_BATCHES = 2
#: float-model MACs the weights check spends on calibration samples beside the check samples (two
#: onnxruntime runs each, the float model's and its with int8 weights: about a second on 2 cores)
IN_SAMPLE_MACS = 2e9
#: repair rounds, each moving one more group of nodes to the host and checking again
REPAIR_ROUNDS = 4


@dataclass
class CheckData:
    """Check samples: `feeds` for the float model (NCHW), `inputs` for CompiledModel.run (as the
    user gives them: channels-last for a folded input), one entry per batch."""

    feeds: list[dict[str, np.ndarray]]
    inputs: list[list[np.ndarray]]
    held_back: bool

    @property
    def samples(self) -> int:
        return sum(len(x[0]) for x in self.inputs)


@dataclass
class Accuracy:
    """The guard's result (CompiledModel.accuracy, the report)."""

    target: float
    samples: int
    held_back: bool
    cosines: dict[str, float]  # per output: the least over the check samples
    moved: dict[str, str] = field(default_factory=dict)  # node -> why the guard put it on the host

    @property
    def worst(self) -> float:
        return min(self.cosines.values(), default=1.0)

    def describe(self) -> str:
        where = "held-back calibration samples" if self.held_back else "calibration samples (in sample)"
        cos = ", ".join(f"{k} {v:.4f}" for k, v in self.cosines.items())
        text = f"cosine against onnxruntime float on {self.samples} {where}: {cos} (target {self.target:g})"
        if self.moved:
            text += f"; repaired by moving {', '.join(self.moved)} to the host"
        return text


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity; 0 when either has a NaN or infinity the other does not have at the same
    place (a logarithm of a value quantised to zero is no match for the float result)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not (fa.all() and fb.all()):
        same = (fa == fb) & ((a == b) | np.isnan(a) & np.isnan(b) | fa)
        if not same.all():
            return 0.0
        a, b = a[fa], b[fb]
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    return float(a @ b / (na * nb + 1e-30))


def hold_back(
    model: onnx.ModelProto, calib: object, nhwc: Mapping, source: str
) -> tuple[object, CheckData | None]:
    """(the calibration data for the quantiser, the check samples) from the user's `calib` (one
    array, or one per input name; channels-last for the inputs in `nhwc`). None when the data do
    not look like samples of the model's inputs (the quantiser then says what is wrong)."""
    g = Graph(model, source)
    try:
        raw = dict(calib) if isinstance(calib, Mapping) else {g.inputs[0]: calib}
        raw = {k: np.asarray(v) for k, v in raw.items()}
        batch = {n: g.shape(n, source)[0] for n in g.inputs}
        want = {n: list(nhwc[n] if n in nhwc else g.shape(n, source)) for n in g.inputs}
        if set(raw) != set(g.inputs) or any(
            a.dtype.kind not in "biuf" or list(a.shape[1:]) != want[n][1:] for n, a in raw.items()
        ):
            return calib, None
        n_batches = min(len(raw[n]) // batch[n] for n in g.inputs)
    except Exception:  # malformed data: _quantize names the problem
        return calib, None
    if n_batches == 0:
        return calib, None
    held = n_batches >= HOLD_BACK_FROM
    k = min(CHECK_BATCHES, n_batches // HOLD_BACK_FROM) if held else min(CHECK_BATCHES, n_batches)
    first = n_batches - k if held else 0
    feeds, inputs = [], []
    for b in range(first, first + k):
        user = {n: raw[n][b * batch[n] : (b + 1) * batch[n]].astype(np.float32) for n in g.inputs}
        feeds.append({n: a.transpose(0, 3, 1, 2) if n in nhwc else a for n, a in user.items()})
        inputs.append([user[n] for n in g.inputs])
    if held:
        kept = {n: raw[n][: first * batch[n]] for n in g.inputs}
        calib = kept if isinstance(calib, Mapping) else kept[g.inputs[0]]
    return calib, CheckData(feeds, inputs, held)


def float_outputs(float_model: onnx.ModelProto, feeds: list[dict]) -> dict[str, list[np.ndarray]]:
    """onnxruntime's outputs of the float model on each feed (check samples), by output name."""
    sess = ort_session(float_model)
    names = [o.name for o in sess.get_outputs()]
    runs = [sess.run(None, f) for f in feeds]
    return {name: [r[k] for r in runs] for k, name in enumerate(names)}


def output_cosines(run: Callable, want: dict[str, list[np.ndarray]], check: CheckData) -> dict[str, float]:
    """The least cosine over the check samples of each output of `run` (a CompiledModel's) against
    the float model's (`float_outputs`)."""
    out: dict[str, float] = {}
    for k, inputs in enumerate(check.inputs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a host log of a value quantised to 0
            got = run(*inputs)
        for (name, w), y in zip(want.items(), got, strict=True):
            out[name] = min(out.get(name, 1.0), cosine(y, w[k]))
    return out


def node_outputs(model: onnx.ModelProto) -> list[str]:
    """Every node output of `model` (the tensors an onnxruntime session can be asked for)."""
    return [o for n in model.graph.node for o in n.output if o]


def intermediates(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every node output of `model` on one sample (onnxruntime)."""
    sess = ort_session(model, node_outputs(model))
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


@dataclass(frozen=True)
class Loss:
    node: str
    op: str
    before: float  # cosine of its inputs as the quantised model sees them (the least)
    after: float  # cosine of its result

    @property
    def drop(self) -> float:
        return self.before - self.after

    def describe(self) -> str:
        return f"{self.node} ({self.op}): cosine {self.before:.4f} -> {self.after:.4f}"


def losses(fv: dict[str, np.ndarray], qdq: onnx.ModelProto, feeds: dict, nodes: set[str]) -> list[Loss]:
    """Per node of `nodes` (names in the QDQ model), the accuracy it loses on one check sample
    against the float model's intermediates `fv` on it, worst first (module docstring)."""
    qv = intermediates(qdq, feeds)
    producer = {o: n for n in qdq.graph.node for o in n.output}

    def source(t: str) -> str | None:
        """The float tensor a DequantizeLinear output stands for (None for a constant)."""
        p = producer.get(t)
        if p is None or p.op_type != "DequantizeLinear":
            return t if t in fv else None
        q = producer.get(p.input[0])
        return q.input[0] if q is not None and q.op_type == "QuantizeLinear" and q.input[0] in fv else None

    out = []
    for n in qdq.graph.node:
        if n.name not in nodes or not n.output or n.output[0] not in fv or n.output[0] not in qv:
            continue
        before = [cosine(qv[i], fv[s]) for i in n.input if i in qv and (s := source(i)) is not None]
        after = cosine(qv[n.output[0]], fv[n.output[0]])
        out.append(Loss(n.name, n.op_type, min(before, default=1.0), after))
    return sorted(out, key=lambda x: -x.drop)


@dataclass(frozen=True)
class Split:
    """Where a quantised model loses accuracy (onnxruntime on the check samples, the least output
    cosine against the float model): its QDQ model as it is, with only its weights quantised (the float
    model with the dequantised weights and biases) and with only its activations
    quantised (the float weights and biases back). The first against the compiled model's own
    cosine tells the NPU's arithmetic (tables, requantisation) from quantisation itself."""

    qdq: float
    weights: float
    activations: float
    npu: float | None = None  # the compiled model's own least cosine, when known

    def describe(self) -> str:
        lq, lw, la = 1.0 - self.qdq, 1.0 - self.weights, 1.0 - self.activations
        if self.npu is not None and 1.0 - self.npu > 2.0 * lq:
            verdict = "quantisation loses little of it, the NPU's arithmetic (tables, requantisation) "
            verdict += "the rest"
        elif lw > 2.0 * la and lw >= lq / 2:
            verdict = "the int8 weights lose it"
        elif la > 2.0 * lw and la >= lq / 2:
            verdict = "the activations' quantisation loses it"
        else:
            verdict = "weights and activations both lose some"
        return (
            f"onnxruntime's QDQ model of it reaches {self.qdq:.4f}, with only the weights quantised "
            f"{self.weights:.4f}, with only the activations quantised {self.activations:.4f}: {verdict}"
        )


def _replaced(model: onnx.ModelProto, swap: Callable[[onnx.NodeProto], list | None]) -> onnx.ModelProto:
    """A copy of `model` with each node for which `swap` gives (nodes, initializers) replaced by them."""
    out = copied(model)
    nodes = []
    for n in out.graph.node:
        got = swap(n)
        if got is None:
            nodes.append(n)
        else:
            nodes.extend(got[0])
            out.graph.initializer.extend(got[1])
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def only_activations_quantised(qdq: onnx.ModelProto, float_model: onnx.ModelProto) -> onnx.ModelProto:
    """`qdq` with the float weights and biases of `float_model` back in place of their
    DequantizeLinear (onnxruntime's quantiser names a weight's `<w>_DequantizeLinear_Output`, a
    bias's after the bias)."""
    consts = {t.name for t in qdq.graph.initializer}
    floats = {t.name: t for t in float_model.graph.initializer}
    suffix = "_DequantizeLinear_Output"

    def swap(n: onnx.NodeProto):
        if n.op_type != "DequantizeLinear" or n.input[0] not in consts:
            return None
        out = n.output[0]
        name = out[: -len(suffix)] if out.endswith(suffix) else out
        if name not in floats:
            return None
        t = onnx.TensorProto()
        t.CopyFrom(floats[name])
        t.name = f"{out}__float"
        return [onnx.helper.make_node("Identity", [t.name], [out], name=n.name)], [t]

    return _replaced(qdq, swap)


def split_loss(
    qdq: onnx.ModelProto, float_model: onnx.ModelProto, check: CheckData, npu: float | None = None
) -> Split:
    """The Split of `qdq` (quantised from `float_model`) on the check samples (`npu`: the compiled
    model's least cosine there)."""
    feeds = check.feeds
    want = float_outputs(float_model, feeds)
    weights = with_quantised_weights(qdq, float_model)
    activations = only_activations_quantised(qdq, float_model)
    return Split(
        _least(qdq, want, feeds), _least(weights, want, feeds), _least(activations, want, feeds), npu
    )


def _least(model: onnx.ModelProto, want: dict[str, list[np.ndarray]], feeds: list[dict]) -> float:
    """The least output cosine of `model` (onnxruntime) against `want` on `feeds`."""
    return 1.0 - float(output_losses(model, want, feeds).max(initial=0.0))


def output_losses(model: onnx.ModelProto, want: dict[str, list[np.ndarray]], feeds: list[dict]) -> np.ndarray:
    """Per feed, 1 - the least cosine of `model`'s outputs (onnxruntime) against `want`'s."""
    sess = ort_session(model, optimized=False)  # docs/real_models.md: the rewritten graphs
    names = [o.name for o in sess.get_outputs()]
    out = []
    for k, f in enumerate(feeds):
        run = dict(zip(names, sess.run(None, f), strict=True))
        out.append(max((1.0 - cosine(run[n], ws[k]) for n, ws in want.items() if n in run), default=0.0))
    return np.asarray(out, np.float64)


def with_quantised_weights(
    qdq: onnx.ModelProto, float_model: onnx.ModelProto, only: Collection[str] | None = None
) -> onnx.ModelProto:
    """`float_model` with each weight and bias replaced by its dequantised value in `qdq`: only the
    weights quantised (`only`: those of these nodes; the others stay float). (Passing the
    activations' QuantizeLinear/DequantizeLinear pairs of `qdq` through instead loses the Relus and
    Clips the quantiser folded into int8 ranges: on a zoo ResNet with int8 activations that measured
    cosine -0.002 for weights that keep 0.99993.)"""
    consts = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    suffix = "_DequantizeLinear_Output"
    values: dict[str, np.ndarray] = {}
    for n in qdq.graph.node:
        if n.op_type != "DequantizeLinear" or n.input[0] not in consts:
            continue
        q = consts[n.input[0]].astype(np.float64)
        scale = consts[n.input[1]].astype(np.float64)
        zp = consts[n.input[2]].astype(np.float64) if len(n.input) > 2 and n.input[2] in consts else 0.0
        if np.ndim(scale):  # per channel along `axis`
            axis = next((a.i for a in n.attribute if a.name == "axis"), 1) % q.ndim
            shape = [1] * q.ndim
            shape[axis] = -1
            scale, zp = scale.reshape(shape), np.reshape(zp, shape) if np.ndim(zp) else zp
        values[n.output[0].removesuffix(suffix)] = (q - zp) * scale
    if only is not None:
        mine = {i for n in float_model.graph.node if n.name in only for i in n.input[1:]}
        values = {k: v for k, v in values.items() if k in mine}
    out = copied(float_model)
    for t in out.graph.initializer:
        if t.name in values and values[t.name].shape == tuple(t.dims):
            t.CopyFrom(numpy_helper.from_array(values[t.name].astype(numpy_helper.to_array(t).dtype), t.name))
    return out


def weights_only(
    qdq: onnx.ModelProto, float_model: onnx.ModelProto, check: CheckData, extra: list[dict] = ()
) -> float:
    """The least output cosine against `float_model` on the check samples of `float_model` with the
    weights `qdq` quantised: below the target, no activation type reaches it with these weights.
    `extra`: more feeds checked the same way (calibration batches: `in_sample_batches`)."""
    feeds = [*check.feeds, *extra]
    return _least(with_quantised_weights(qdq, float_model), float_outputs(float_model, feeds), feeds)


def in_sample_batches(batches: list[dict], macs: float) -> list[dict]:
    """The calibration batches the weights check also runs (in sample: the quantiser saw them), as
    many as `IN_SAMPLE_MACS` allows for a model of `macs` MACs. Two held-back samples miss a loss
    that only some inputs show: a MobileNet whose int8 weights keep 0.9992 on both gave 0.988 on a
    test input, and 0.989 on one of its 30 calibration samples (docs/compiler.md)."""
    return batches[: int(IN_SAMPLE_MACS // max(macs, 1.0))]


def upstream(qdq: onnx.ModelProto, node: str, npu: set[str], views: set[str] = frozenset()) -> list[str]:
    """The NPU nodes whose quantised results `node` reads, directly, through views of them (a
    reshape moves no data: the result is its input's) or through host nodes whose results are
    float (moving them to the host keeps those results float too)."""
    producer = {o: n for n in qdq.graph.node for o in n.output}
    start = next(x for x in qdq.graph.node if x.name == node)
    found, stack, seen = [], [start], {node}
    while stack:
        for i in stack.pop().input:
            p = producer.get(i)
            if p is not None and p.op_type == "DequantizeLinear":
                q = producer.get(p.input[0])
                p = producer.get(q.input[0]) if q is not None and q.op_type == "QuantizeLinear" else None
                if p is not None and p.name in npu and p.name not in found:
                    found.append(p.name)
                elif p is not None and p.name in views and p.name not in seen:
                    seen.add(p.name)
                    stack.append(p)
            elif p is not None and p.name not in seen and p.name not in npu:
                seen.add(p.name)
                stack.append(p)  # a float result of the host: look at what it reads
    return found


def guard(
    compiled,
    float_model: onnx.ModelProto,
    float_clean: onnx.ModelProto,
    check: CheckData,
    target: float,
    rebuild: Callable[[dict[str, str]], object],
    source: str,
    hint: str = "",
    rounds: int = REPAIR_ROUNDS,
    explain: bool = True,
    outputs: list[list[np.ndarray]] | None = None,
):
    """`compiled` if it reaches `target` on the check samples, else a rebuild with the worst
    operators on the host that does (at most `rounds` rebuilds); AccuracyError otherwise (`hint`:
    options worth trying first; `explain`: with where the loss is, weights or activations, from
    split_loss; `outputs`: `compiled`'s outputs on the check samples, when computed elsewhere,
    compiler/parallel.py). Sets `compiled.accuracy`."""
    reference = float_outputs(float_model, check.feeds)  # run once for every round
    given = iter(outputs or ())
    cos = output_cosines(compiled.run if outputs is None else lambda *_: next(given), reference, check)
    acc = Accuracy(target, check.samples, check.held_back, cos)
    if acc.worst >= target:
        compiled.accuracy = acc
        return compiled
    fv = intermediates(float_clean, check.feeds[0])
    ranked = _ranked(compiled, fv, check)
    first, worst, first_qdq = ranked, acc.worst, compiled.qdq
    moved: dict[str, str] = {}
    for _ in range(rounds):
        # the worst node with something left to move: itself, if on the NPU, and the NPU nodes
        # whose quantised results it reads
        npu = {la.node for la in compiled.lowered.layers if _on_npu(la)}
        views = {la.node for la in compiled.lowered.layers if la.placement == "view" and not _on_npu(la)}
        want = dict(moved)
        for x in ranked:
            up = upstream(compiled.qdq, x.node, npu, views)
            new = [n for n in [x.node, *up] if n in npu and n not in moved]
            if new:
                want.update((n, f"the accuracy guard: {x.describe()} with quantised data") for n in new)
                break
        if want == moved:
            break
        moved = want
        repaired = rebuild(moved)
        cos2 = output_cosines(repaired.run, reference, check)
        if min(cos2.values(), default=1.0) >= target:
            repaired.accuracy = Accuracy(target, check.samples, check.held_back, cos2, moved)
            return repaired
        if min(cos2.values(), default=1.0) <= worst + 1e-4:
            break  # the move did not help: the loss is not where the ranking points (spread out)
        worst = min(cos2.values(), default=1.0)
        compiled = repaired
        ranked = _ranked(repaired, fv, check)
    name = min(cos, key=cos.get)
    names = "; ".join(x.describe() for x in first[:3]) or "none stands out (the loss is spread out)"
    where = ""
    try:
        if explain:
            where = f"; {split_loss(first_qdq, float_clean, check, acc.worst).describe()}"
    except Exception as e:  # noqa: BLE001 - a diagnostic of the refusal must not hide the refusal
        where = f"; (where the loss is could not be measured: {type(e).__name__})"
    raise AccuracyError(
        f"{source}: output {name!r} of the compiled model reaches cosine {cos[name]:.4f} against "
        f"onnxruntime float on {acc.samples} {'held-back ' if acc.held_back else ''}calibration "
        f"sample(s), below the target {target:g}; the operators losing the most: {names}"
        + (f"; moving {', '.join(moved)} to the host did not reach it" if moved else "")
        + where
        + f". Try {hint}calibration data like the real inputs, a lower --target-cosine, or "
        "--no-accuracy-check to take the model as it is"
    )


def _on_npu(la) -> bool:
    """An NPU operator, or a node its producer computes on the NPU (a fused Relu or table)."""
    return la.placement == "npu" or is_fused(la)


def _ranked(compiled, fv: dict[str, np.ndarray], check: CheckData) -> list[Loss]:
    """The nodes (NPU or host) that lose accuracy (over 1e-5 of cosine) on the first check sample,
    worst first."""
    nodes = {la.node for la in compiled.lowered.layers if la.placement == "host" or _on_npu(la)}
    return [x for x in losses(fv, compiled.qdq, check.feeds[0], nodes) if x.drop > 1e-5]
