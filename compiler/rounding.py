"""Weight rounding that minimises each layer's output error on the calibration data (GPTQ/OPTQ:
Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers",
ICLR 2023; the Optimal Brain Surgeon update of Hassibi and Stork).

Rounding every weight to its nearest int8 step minimises the error of each weight alone. What a layer
computes is X.W for the inputs X it sees, so the error that matters is ||X (W - Wq)||^2 = tr(E H E^T)
with H = X^T X from the calibration inputs. GPTQ rounds the weights of an output channel one input
column at a time and spreads each rounding error over the columns not yet rounded, in proportion to
how their inputs correlate (the inverse of H). The scales stay the quantiser's, so nothing else in the
model changes: only which int8 value each weight takes.

A layer keeps its nearest rounding if GPTQ does not lower its output error on the calibration data
(a depthwise convolution's tiny H can make the spread overshoot), or if the calibration data give it
too few input vectors to estimate H (a classifier's head). With "auto" (the compiler's default), the
model keeps GPTQ's rounding only if the whole model's outputs on the calibration inputs come out
closer to the float model's: layer by layer gains need not add up through a network, and a model
whose outputs barely change either way keeps the quantiser's rounding.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from .graph import CompileError
from .options import ROUNDINGS
from .quantize import content_key, ort_session
from .shapes import copied, inferred_graph

#: "auto" keeps GPTQ's rounding when the model's output error on the calibration inputs is at most
#: this fraction of nearest rounding's (a per-layer gain that does not carry through the model, or
#: is within the noise of a few samples, is not worth departing from the quantiser)
AUTO_MARGIN = 0.9
#: Hessian damping: this fraction of its mean diagonal is added (the GPTQ paper's 1 %)
DAMP = 0.01
#: columns rounded together before the rest of the layer is updated (one BLAS product per block)
BLOCK = 128
#: bytes of float32 Hessians gathered in one pass over the calibration data
HESSIAN_BUDGET = 256 << 20
QMIN, QMAX = -128, 127
#: a layer is rounded by GPTQ only if the calibration data give it at least this many input vectors
#: per weight column: a head Gemm sees one vector per sample, and GPTQ would move its rounding errors
#: into the directions those few vectors leave out, where other inputs have their energy
MIN_SAMPLES = 4
#: output positions per sample a convolution's H is gathered from (a coarser grid on larger maps)
MAX_POSITIONS = 4096


@dataclass
class _Layer:
    node: onnx.NodeProto  # the Conv / Gemm / MatMul of the QDQ model
    act: str  # the float tensor its input is quantised from
    weight: onnx.TensorProto  # its int8 weight initializer (QDQ model)
    scale: np.ndarray  # per output row (float64)
    float_w: np.ndarray  # the float weights, as the float model has them
    groups: int  # Conv groups (1 otherwise)

    @property
    def cols(self) -> int:
        """Columns of the per-group weight matrix (inputs of one output)."""
        w = self.float_w
        return int(np.prod(w.shape[1:])) if self.node.op_type == "Conv" else self.rows_matrix().shape[1]

    def rows_matrix(self, w: np.ndarray | None = None) -> np.ndarray:
        """Weights (the float ones by default) as output rows x inputs (Conv: Cout x Cin/g*kh*kw)."""
        w = self.float_w if w is None else w
        if self.node.op_type == "Conv":
            return w.reshape(w.shape[0], -1)
        return w if self.trans_b else w.T

    def from_rows(self, q: np.ndarray) -> np.ndarray:
        """The inverse of `rows_matrix`: rows x inputs back to the initializer's shape."""
        if self.node.op_type == "Conv":
            return q.reshape(self.float_w.shape)
        return q if self.trans_b else np.ascontiguousarray(q.T)

    @property
    def trans_b(self) -> bool:
        return self.node.op_type == "Gemm" and bool(_attrs(self.node).get("transB", 0))


@dataclass
class RoundingReport:
    layers: int  # layers whose weights GPTQ considered
    changed: int  # layers that took the GPTQ rounding
    error_ratio: float  # the layers' summed output error on the calibration data, GPTQ over nearest
    model_ratio: float | None = None  # "auto": the model's output error, GPTQ over nearest
    kept: bool = True  # "auto": GPTQ's rounding was kept
    skipped: str | None = None  # "auto": why GPTQ was not tried

    def describe(self) -> str:
        if self.skipped:
            return f"weights rounded to nearest ({self.skipped})"
        layers = (
            f"GPTQ in {self.changed} of {self.layers} layers (their output error on the calibration "
            f"inputs {self.error_ratio:.2f}x of nearest rounding's"
        )
        if self.model_ratio is None:
            return f"weights rounded by {layers})"
        if self.kept:
            return f"weights rounded by {layers}; the model's {self.model_ratio:.2f}x)"
        return (
            f"weights rounded to nearest: {layers}) left the model's output error on them "
            f"{self.model_ratio:.2f}x"
        )


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _layers(qdq: onnx.ModelProto, float_model: onnx.ModelProto) -> list[_Layer]:
    """The QDQ model's Conv/Gemm/MatMul nodes with an int8 weight initializer of zero point 0 read
    by them alone, an input quantised from a float tensor, and float weights of the same shape in
    the float model's node of the same name."""
    producer = {o: n for n in qdq.graph.node for o in n.output}
    readers: dict[str, int] = {}
    for n in qdq.graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    inits = {t.name: t for t in qdq.graph.initializer}
    finits = {t.name: t for t in float_model.graph.initializer}
    fnodes = {n.name: n for n in float_model.graph.node if n.name}
    ftensors = {o for n in float_model.graph.node for o in n.output}
    ftensors |= {i.name for i in float_model.graph.input}
    out = []
    for n in qdq.graph.node:
        if n.op_type not in ("Conv", "Gemm", "MatMul") or len(n.input) < 2 or n.name not in fnodes:
            continue
        dq_x, dq_w = producer.get(n.input[0]), producer.get(n.input[1])
        if not (_is(dq_x, "DequantizeLinear") and _is(dq_w, "DequantizeLinear")):
            continue
        q_x, w = producer.get(dq_x.input[0]), inits.get(dq_w.input[0])
        if not _is(q_x, "QuantizeLinear") or w is None or w.data_type != onnx.TensorProto.INT8:
            continue
        act = _float_name(q_x.input[0], ftensors)
        if act is None:
            continue
        if readers.get(w.name, 0) != 1 or readers.get(dq_w.output[0], 0) != 1:
            continue  # shared weights: one rounding cannot suit every reader
        scale, zp = (inits.get(i) for i in (list(dq_w.input[1:3]) + [""])[:2])
        if scale is None or (zp is not None and numpy_helper.to_array(zp).any()):
            continue
        fn = fnodes[n.name]
        fw = finits.get(fn.input[1]) if fn.op_type == n.op_type and len(fn.input) > 1 else None
        if fw is None or tuple(fw.dims) != tuple(w.dims):
            continue
        a = _attrs(n)
        conv = n.op_type == "Conv"
        if len(w.dims) != (4 if conv else 2) or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            continue  # 1-D/3-D convolutions and implicit padding: left as they are
        float_w = numpy_helper.to_array(fw).astype(np.float64)
        layer = _Layer(n, act, w, np.zeros(0), float_w, int(a.get("group", 1)) if conv else 1)
        rows = layer.rows_matrix().shape[0]
        scale = numpy_helper.to_array(scale).astype(np.float64).reshape(-1)
        if scale.size not in (1, rows):
            continue
        layer.scale = np.broadcast_to(scale, (rows,)).copy()
        out.append(layer)
    return out


def _float_name(name: str, ftensors: set[str]) -> str | None:
    """The float model's name of a tensor of the QDQ model (the quantiser renames a graph output
    it quantises to NAME_QuantizeLinear_Input), None if it has none."""
    if name in ftensors:
        return name
    base = name.removesuffix("_QuantizeLinear_Input")
    return base if base in ftensors else None


def _is(node: onnx.NodeProto | None, op: str) -> bool:
    return node is not None and node.op_type == op


def _conv_grid(layer: _Layer, h: int, w: int) -> tuple[int, int, int, int]:
    """The output positions (rows, columns) and input strides H is gathered at for a convolution
    over an h x w map: every position, or on a large map those of a coarser grid (neighbouring
    windows overlap, so H's estimate loses little, and gathering it costs a fraction)."""
    a = _attrs(layer.node)
    _, _, kh, kw = layer.float_w.shape
    sh, sw = a.get("strides", [1, 1])
    dh, dw = a.get("dilations", [1, 1])
    pt, pl, pb, pr = a.get("pads", [0, 0, 0, 0])
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    g = max(1, math.ceil(math.sqrt(oh * ow / MAX_POSITIONS)))
    return -(-oh // g), -(-ow // g), sh * g, sw * g


def _columns(layer: _Layer, x: np.ndarray) -> np.ndarray:
    """The layer's input `x` as (groups, samples, columns) float32: im2col for a convolution."""
    if layer.node.op_type != "Conv":
        return x.reshape(1, -1, x.shape[-1]).astype(np.float32, copy=False)
    a = _attrs(layer.node)
    _, cig, kh, kw = layer.float_w.shape
    dh, dw = a.get("dilations", [1, 1])
    pt, pl, pb, pr = a.get("pads", [0, 0, 0, 0])
    n, c, h, w = x.shape
    xp = np.pad(x.astype(np.float32, copy=False), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh, ow, sh, sw = _conv_grid(layer, h, w)
    cols = np.empty((n, c, kh, kw, oh, ow), np.float32)
    for i in range(kh):
        for j in range(kw):
            y0, x0 = i * dh, j * dw
            cols[:, :, i, j] = xp[:, :, y0 : y0 + sh * (oh - 1) + 1 : sh, x0 : x0 + sw * (ow - 1) + 1 : sw]
    g, k = layer.groups, cig * kh * kw  # weight column order is (Cin/g, kh, kw) within a group
    return cols.reshape(n, g, k, oh * ow).transpose(1, 0, 3, 2).reshape(g, -1, k)


def _input_vectors(layer: _Layer, dims: list[int] | None) -> int | None:
    """The input vectors `_columns` makes of an input of shape `dims` (None: not known)."""
    if dims is None or any(d <= 0 for d in dims):
        return None
    if layer.node.op_type != "Conv":
        return math.prod(dims[:-1])
    if len(dims) != 4:
        return None
    oh, ow, _, _ = _conv_grid(layer, dims[2], dims[3])
    return dims[0] * oh * ow


def _shapes(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, list[int]]:
    """Every tensor's shape in `model` fed `feed` (onnx's shape inference on the model's skeleton
    with the feed's input shapes; a dimension it cannot give is 0)."""

    def dims(vi) -> list[int]:
        return [d.dim_value for d in vi.type.tensor_type.shape.dim]

    try:
        g = inferred_graph(model, input_shapes={k: v.shape for k, v in feed.items()})
    except Exception:  # noqa: BLE001 - shapes are an optimisation here: unknown means gather
        return {}
    return {
        vi.name: dims(vi) for vi in [*g.input, *g.value_info, *g.output] if vi.type.HasField("tensor_type")
    }


def _worth_gathering(layers: list[_Layer], float_model: onnx.ModelProto, batches: list[dict]) -> list[bool]:
    """Per layer, whether the calibration batches give it MIN_SAMPLES input vectors per weight
    column (else GPTQ leaves it at nearest rounding, and its H is not worth gathering: on a
    ResNet-50-class net the deep layers' H were most of the gathering's time and memory). A layer
    whose input shape inference does not give is gathered."""
    by_shape: dict[tuple, dict[str, list[int]]] = {}
    counts: list[int | None] = [0] * len(layers)
    for feed in batches:
        key = tuple(sorted((k, tuple(v.shape)) for k, v in feed.items()))
        if key not in by_shape:
            by_shape[key] = _shapes(float_model, feed)
        shapes = by_shape[key]
        for i, la in enumerate(layers):
            n = _input_vectors(la, shapes.get(la.act))
            counts[i] = None if n is None or counts[i] is None else counts[i] + n
    return [c is None or c >= MIN_SAMPLES * la.cols for c, la in zip(counts, layers, strict=True)]


def _exposing(float_model: onnx.ModelProto, names: list[str]):
    """onnxruntime on `float_model` with the tensors `names` among its outputs: (the session, the
    names to fetch from it; a graph input among `names` comes from the feed instead)."""
    m = copied(float_model)
    have = {o.name for o in m.graph.output}
    inputs = {i.name for i in m.graph.input}
    for name in names:
        if name not in have and name not in inputs:
            m.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return ort_session(m), [n for n in names if n not in inputs]


def _hessians(
    layers: list[_Layer],
    float_model: onnx.ModelProto,
    batches: Iterable[dict[str, np.ndarray]],
    every: bool = False,
) -> tuple[list[np.ndarray], list[int], list[list[np.ndarray]]]:
    """H = X^T X per layer and group from the float model's inputs of each layer (None for a layer
    not worth gathering, `_worth_gathering`, unless `every`), the number of input vectors each
    sums, gathered in as few passes over the calibration data as the memory budget allows, and the
    float model's outputs for each batch (taken in the first pass)."""
    batches = list(batches)
    graph_outs = [o.name for o in float_model.graph.output]
    float_outs: list[list[np.ndarray]] = []
    hs: list[np.ndarray] = [None] * len(layers)  # type: ignore[list-item]
    counts = [0] * len(layers)
    chunks, cur, size = [], [], 0
    worth = [True] * len(layers) if every else _worth_gathering(layers, float_model, batches)
    for i, la in enumerate(layers):
        if not worth[i]:
            continue
        b = 4 * la.groups * la.cols**2
        if cur and size + b > HESSIAN_BUDGET:
            chunks.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += b
    if cur or not chunks:  # one pass at least: it takes the float outputs
        chunks.append(cur)
    for chunk in chunks:
        outs = list(dict.fromkeys(layers[i].act for i in chunk))
        sess, fetch = _exposing(float_model, outs)
        fetch += [o for o in graph_outs if o not in fetch] if not float_outs else []
        for feed in batches:
            got = dict(zip(fetch, sess.run(fetch, feed), strict=True)) if fetch else {}
            got.update({k: v for k, v in feed.items() if k in outs})
            if len(float_outs) < len(batches):
                float_outs.append([got[o] for o in graph_outs])
            for i in chunk:
                cols = _columns(layers[i], got[layers[i].act])
                h = np.matmul(cols.transpose(0, 2, 1), cols)
                if hs[i] is None:
                    hs[i] = h
                else:
                    hs[i] += h
                counts[i] += cols.shape[1]
    return hs, counts, float_outs


def gptq(w: np.ndarray, scale: np.ndarray, h: np.ndarray, damp: float = DAMP) -> np.ndarray:
    """int8 rounding of `w` (rows x columns, float) at per-row `scale` that lowers tr(E H E^T),
    E = w - scale * q, by GPTQ's column-by-column error feedback in blocks of BLOCK columns."""
    w = w.astype(np.float64).copy()
    h = h.astype(np.float64).copy()
    d = w.shape[1]
    dead = np.diag(h) == 0  # inputs never non-zero in calibration: rounded to nearest, no spread
    h[dead, dead] = 1.0
    h += damp * np.mean(np.diag(h)) * np.eye(d)
    try:
        u = np.linalg.cholesky(np.linalg.inv(h)).T  # upper: H^-1 = U^T U
    except np.linalg.LinAlgError:
        return np.clip(np.round(w / scale[:, None]), QMIN, QMAX).astype(np.int8)
    q = np.empty_like(w)
    for b0 in range(0, d, BLOCK):
        b1 = min(b0 + BLOCK, d)
        wb = w[:, b0:b1].copy()
        err = np.empty_like(wb)
        for j in range(b1 - b0):
            c = b0 + j
            qc = np.clip(np.round(wb[:, j] / scale), QMIN, QMAX)
            q[:, c] = qc
            e = (wb[:, j] - qc * scale) / u[c, c]
            err[:, j] = e
            wb[:, j + 1 :] -= np.outer(e, u[c, c + 1 : b1])
        w[:, b1:] -= err @ u[b0:b1, b1:]
    return q.astype(np.int8)


def _error(w: np.ndarray, scale: np.ndarray, q: np.ndarray, h: np.ndarray) -> float:
    e = w - q.astype(np.float64) * scale[:, None]
    return float(np.sum((e @ h) * e))  # tr(E H E^T) through one BLAS product


def output_errors(
    models: list[onnx.ModelProto], want: list[list[np.ndarray]], batches: list[dict[str, np.ndarray]]
) -> list[float]:
    """Per model: the squared error of its outputs against the float model's (`want`, per batch)
    over the batches, relative to the float outputs' energy, summed over the outputs (each output
    counts alike)."""
    outs = range(len(want[0]))
    energy = [sum(float(np.sum(np.square(w[k], dtype=np.float64))) for w in want) for k in outs]
    errs = []
    for m in models:
        sess = ort_session(m)
        err = [0.0] * len(energy)
        for feed, w in zip(batches, want, strict=True):
            for k, (g, r) in enumerate(zip(sess.run(None, feed), w, strict=True)):
                err[k] += float(np.sum(np.square(g.astype(np.float64) - r)))
        errs.append(sum(e / max(en, 1e-30) for e, en in zip(err, energy, strict=True)))
    return errs


def weight_errors(
    qdq: onnx.ModelProto, float_model: onnx.ModelProto, batches: list[dict[str, np.ndarray]]
) -> dict[str, float]:
    """Per Conv/Gemm/MatMul node of `qdq` with int8 weights: the output error its int8 weights alone
    add on the calibration `batches`, relative to its output's energy: tr(E H E^T) / tr(W H W^T)
    with H = X^T X of its float inputs (every layer gathered, however few its input vectors)."""
    layers = _layers(qdq, float_model)
    if not layers:
        return {}
    hs, _, _ = _hessians(layers, float_model, batches, every=True)
    out = {}
    for la, h in zip(layers, hs, strict=True):
        w, q = la.rows_matrix(), la.rows_matrix(numpy_helper.to_array(la.weight)).astype(np.float64)
        per = w.shape[0] // la.groups
        err = sig = 0.0
        for g in range(la.groups):
            r = slice(g * per, (g + 1) * per)
            hg = h[g].astype(np.float64)
            err += _error(w[r], la.scale[r], q[r], hg)
            sig += float(np.sum((w[r] @ hg) * w[r]))
        out[la.node.name] = err / sig if sig > 0 else 0.0
    return out


#: float models (with their calibration data) whose rounding results are kept: `auto` activations
#: quantise a model up to twice (int8/int16 mix, then int16), a design-space sweep compiles it for
#: every configuration, and the layers' Hessians and GPTQ depend on neither
MEMO_MODELS = 2
_memo: OrderedDict[str, dict] = OrderedDict()
_memo_lock = threading.Lock()


def _layer_key(la: _Layer) -> str:
    """What a layer's rounding depends on besides the float model and the data: its input tensor,
    the quantiser's int8 weights and their scales."""
    h = hashlib.sha256(f"{la.act}|{la.groups}|{la.weight.name}".encode())
    h.update(numpy_helper.to_array(la.weight).tobytes())
    h.update(np.ascontiguousarray(la.scale, dtype=np.float64).tobytes())
    return h.hexdigest()


def _rounded_layers(layers: list[_Layer], float_model, batches) -> tuple[list, list[list[np.ndarray]]]:
    """Per layer (best int8 rows, GPTQ's error, nearest's error), or None for a layer with too few
    inputs, and the float model's outputs per batch; from the memo when this model, these data
    and every layer's quantisation were rounded before (same results: nothing here is random)."""
    key = content_key(float_model, batches)
    lkeys = [_layer_key(la) for la in layers]
    with _memo_lock:
        entry = _memo.get(key)
        if entry is not None:
            _memo.move_to_end(key)
            if all(k in entry["layers"] for k in lkeys):
                return [entry["layers"][k] for k in lkeys], entry["want"]
    hs, counts, want = _hessians(layers, float_model, batches)
    results = []
    for la, h, count in zip(layers, hs, counts, strict=True):
        if count < MIN_SAMPLES * la.cols:
            results.append(None)  # too few inputs to know the layer's input correlations: nearest
            continue
        w = la.rows_matrix()
        per = w.shape[0] // la.groups
        nearest = la.rows_matrix(numpy_helper.to_array(la.weight))  # the quantiser's rounding
        best = nearest.copy()
        err_g = err_n = 0.0
        for g in range(la.groups):
            r = slice(g * per, (g + 1) * per)
            hg = h[g].astype(np.float64)
            cand = gptq(w[r], la.scale[r], hg)
            eg, en = _error(w[r], la.scale[r], cand, hg), _error(w[r], la.scale[r], nearest[r], hg)
            if eg < en:
                best[r] = cand
            err_g += min(eg, en)
            err_n += en
        results.append((best, err_g, err_n))
    with _memo_lock:
        entry = _memo.setdefault(key, {"want": want, "layers": {}})
        entry["layers"].update(zip(lkeys, results, strict=True))
        _memo.move_to_end(key)
        while len(_memo) > MEMO_MODELS:
            _memo.popitem(last=False)
    return results, want


def round_weights(
    qdq: onnx.ModelProto,
    float_model: onnx.ModelProto,
    batches: list[dict[str, np.ndarray]],
    source: str = "model",
    mode: str = "gptq",
) -> tuple[onnx.ModelProto, RoundingReport]:
    """`qdq` (quantised from `float_model` by onnxruntime) with its int8 weights rounded by GPTQ on
    the calibration `batches` (feeds of the float model) in each layer where that lowers the layer's
    output error. `mode` "auto": only if the whole model's output error on the calibration inputs
    falls too (by AUTO_MARGIN), else `qdq` as it is."""
    if mode not in ("gptq", "auto"):
        raise CompileError(f"weight_rounding must be one of {', '.join(ROUNDINGS)}, not {mode!r}")
    nearest_model = qdq
    qdq = copied(qdq)
    layers = _layers(qdq, float_model)
    if not layers:
        return nearest_model, RoundingReport(0, 0, 1.0)
    try:
        results, want = _rounded_layers(layers, float_model, batches)
    except Exception as e:  # onnxruntime's errors name the node; keep ours naming the model
        why = f"gathering the layers' inputs for GPTQ rounding failed: {e}"
        if mode == "auto":  # the default: the quantiser's rounding is a fine answer
            return nearest_model, RoundingReport(len(layers), 0, 1.0, kept=False, skipped=why)
        raise CompileError(f"{source}: {why}") from e
    changed, err_g, err_n = 0, 0.0, 0.0
    for la, res in zip(layers, results, strict=True):
        if res is None:
            continue
        best, eg, en = res
        err_g, err_n = err_g + eg, err_n + en
        if not np.array_equal(best, la.rows_matrix(numpy_helper.to_array(la.weight))):
            changed += 1
        la.weight.CopyFrom(numpy_helper.from_array(la.from_rows(best), la.weight.name))
    report = RoundingReport(len(layers), changed, err_g / err_n if err_n > 0 else 1.0)
    if mode == "auto" and changed:
        e_near, e_gptq = output_errors([nearest_model, qdq], want, batches)
        report.model_ratio = e_gptq / max(e_near, 1e-30)
        report.kept = report.model_ratio <= AUTO_MARGIN
        if not report.kept:
            return nearest_model, report
    return qdq, report


# -- bias correction -------------------------------------------------------------------------------
# Rounding moves each output's expected value: E[X Wq^T] - E[X W^T] = E[X] (Wq - W)^T per output
# channel, a shift the layers after it see on every input (Nagel et al., "Data-Free Quantization
# Through Weight Equalization and Bias Correction", ICCV 2019, section 4.2). The layer's int32 bias
# absorbs it, from the mean input column on the calibration data (the float model's inputs of the
# layer, im2col'd as GPTQ's Hessians are, so borders and strides count as the layer sees them).


@dataclass
class BiasReport:
    layers: int  # layers with int8 weights, an int32 bias of their own and an int16 input
    corrected: int  # of them, whose bias changed

    def describe(self) -> str:
        return (
            f"biases corrected for the weights' rounding in {self.corrected} of {self.layers} layers "
            "with int16 inputs"
        )


@dataclass
class _Index:
    """A QDQ graph's lookups, made once: each tensor's producer, the initializers, the readers of each
    tensor."""

    producer: dict[str, onnx.NodeProto]
    inits: dict[str, onnx.TensorProto]
    readers: dict[str, int]

    @classmethod
    def of(cls, qdq: onnx.ModelProto) -> _Index:
        readers: dict[str, int] = {}
        for n in qdq.graph.node:
            for i in n.input:
                readers[i] = readers.get(i, 0) + 1
        producer = {o: n for n in qdq.graph.node for o in n.output}
        return cls(producer, {t.name: t for t in qdq.graph.initializer}, readers)


def _bias(ix: _Index, layer: _Layer) -> tuple[onnx.TensorProto, np.ndarray] | None:
    """The layer's int32 bias initializer and its per-row scale, when a DequantizeLinear of zero
    point 0 read by this layer alone makes it."""
    n = layer.node
    if n.op_type not in ("Conv", "Gemm") or len(n.input) < 3 or not n.input[2]:
        return None
    dq = ix.producer.get(n.input[2])
    if not _is(dq, "DequantizeLinear") or dq.input[0] not in ix.inits or len(dq.input) < 2:
        return None
    b, s = ix.inits[dq.input[0]], ix.inits.get(dq.input[1])
    zp = ix.inits.get(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    if b.data_type != onnx.TensorProto.INT32 or s is None:
        return None
    if zp is not None and numpy_helper.to_array(zp).any():
        return None
    if ix.readers.get(b.name, 0) != 1 or ix.readers.get(dq.output[0], 0) != 1:
        return None  # shared: one correction cannot suit every reader
    rows = layer.rows_matrix().shape[0]
    scale = numpy_helper.to_array(s).astype(np.float64).reshape(-1)
    if scale.size not in (1, rows) or tuple(b.dims) != (rows,):
        return None
    return b, np.broadcast_to(scale, (rows,))


def _wide_input(ix: _Index, layer: _Layer) -> bool:
    """Whether the layer's input is quantised to 16 bits. Only those layers are corrected: with int8
    inputs their own rounding and clipping err as much as the weights, and the correction measured
    on the real-model set's rendered calibration pages made the real held-out inputs worse as often
    as better (docs/compiler.md, "Bias correction")."""
    q = ix.producer.get(ix.producer[layer.node.input[0]].input[0])
    zp = ix.inits.get(q.input[2]) if q is not None and len(q.input) > 2 else None
    return zp is not None and zp.data_type in (onnx.TensorProto.INT16, onnx.TensorProto.UINT16)


def _input_means(layers: list[_Layer], float_model: onnx.ModelProto, batches: list[dict]) -> list[np.ndarray]:
    """Per layer, its mean input column per group (groups x columns) over the calibration batches."""
    sess, fetch = _exposing(float_model, list(dict.fromkeys(la.act for la in layers)))
    sums: list[np.ndarray | None] = [None] * len(layers)
    counts = [0] * len(layers)
    for feed in batches:
        got = dict(zip(fetch, sess.run(fetch, feed), strict=True)) if fetch else {}
        got.update(feed)
        for i, la in enumerate(layers):
            cols = _columns(la, got[la.act])
            s = cols.sum(axis=1, dtype=np.float64)
            sums[i] = s if sums[i] is None else sums[i] + s
            counts[i] += cols.shape[1]
    return [s / max(c, 1) for s, c in zip(sums, counts, strict=True)]


def correct_biases(
    qdq: onnx.ModelProto, float_model: onnx.ModelProto, batches: list[dict[str, np.ndarray]]
) -> tuple[onnx.ModelProto, BiasReport]:
    """`qdq` with each int8 layer's int32 bias corrected for the mean error its weights' rounding
    adds to its outputs on the calibration `batches` (feeds of `float_model`); layers without a bias
    of their own are left as they are."""
    qdq = copied(qdq)
    ix = _Index.of(qdq)
    found = [(la, _bias(ix, la)) for la in _layers(qdq, float_model) if _wide_input(ix, la)]
    found = [(la, bias) for la, bias in found if bias is not None]
    if not found:
        return qdq, BiasReport(0, 0)
    means = _input_means([la for la, _ in found], float_model, batches)
    corrected = 0
    for (la, (b, bscale)), mean in zip(found, means, strict=True):
        wq = la.rows_matrix(numpy_helper.to_array(la.weight)).astype(np.float64) * la.scale[:, None]
        err = wq - la.rows_matrix()
        per = err.shape[0] // la.groups
        delta = np.concatenate([err[g * per : (g + 1) * per] @ mean[g] for g in range(la.groups)])
        steps = delta / bscale
        old = numpy_helper.to_array(b).astype(np.int64)
        new = np.clip(np.round(old - steps), -(2**31), 2**31 - 1).astype(np.int32)
        corrected += not np.array_equal(new, old)
        b.CopyFrom(numpy_helper.from_array(new, b.name))
    return qdq, BiasReport(len(found), corrected)
