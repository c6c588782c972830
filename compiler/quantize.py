"""Quantisation: float models to QDQ int8 with onnxruntime's static quantiser, the quantised tensor
types of the lowering, and the fixed-point arithmetic of requantisation on the vector unit.

Float models are quantised with int8 activations, symmetric int8 weights (one scale per tensor, or per
output channel where a tensor's channels differ widely in range) and int32 biases from calibration
data; QDQ models are taken as they are.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import math
import os
import tempfile
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
from onnx import numpy_helper

from npu.container import TensorDesc
from npu.tensors import Layout

from .graph import CompileError, Graph
from .options import ACTIVATIONS, CALIB_METHODS, WEIGHT_SCALES
from .shapes import copied, infer_in_place

ORT_MAX_IR = 10


@dataclass
class QTensor:
    """An int8 (`elem` 1) or int16 (`elem` 2) tensor: real value = scale * (q - zero_point)."""

    name: str
    shape: tuple[int, ...]
    scale: float
    zero_point: int
    elem: int = 1

    @property
    def qmin(self) -> int:
        return -(1 << (8 * self.elem - 1))

    @property
    def qmax(self) -> int:
        return (1 << (8 * self.elem - 1)) - 1

    @property
    def wide(self) -> bool:
        """True for int16."""
        return self.elem == 2


@dataclass
class Act:
    """A quantised activation placed in DRAM: `layout` says where each element lives. With
    `scales`, int32 accumulator values (real = scales[c] x q, c the column: compiler/outputs.py)."""

    q: QTensor
    addr: int
    layout: Layout
    scales: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes

    def desc(self, name: str) -> TensorDesc:
        """The container's description of this tensor under `name`."""
        scales = None if self.scales is None else [float(s) for s in self.scales]
        return TensorDesc(
            name, list(self.q.shape), self.q.scale, self.q.zero_point, self.addr, self.layout, scales
        )


# ---- requantisation arithmetic (the vector unit's multiplier / shift / zero points) ----------------


def quant_multiplier(real: float, where: str) -> tuple[int, int]:
    """(mult, shift) with mult / 2**shift ~ real, mult < 2**31, 0 <= shift <= 62."""
    if not real > 0 or not math.isfinite(real):
        raise CompileError(f"{where}: requantisation scale {real} is not a positive number")
    m, e = math.frexp(real)  # real = m * 2**e, 0.5 <= m < 1
    mult, shift = round(m * (1 << 31)), 31 - e
    if mult == 1 << 31:
        mult, shift = mult // 2, shift - 1
    while shift > 62:
        mult, shift = (mult + 1) >> 1, shift - 1
    if shift < 0:
        raise CompileError(f"{where}: requantisation scale {real} is too large for the vector unit")
    return max(mult, 1), shift


def channel_requant(x: QTensor, s_w: np.ndarray, y: QTensor, where: str, lo: int = -128) -> dict:
    """VMAP fields from a GEMM's or convolution's int32 accumulators to `y`: one (mult, shift) pair,
    or arrays of one per output channel when the weights' per-channel scales give different ones."""
    pairs = [quant_multiplier(x.scale * float(s) / y.scale, where) for s in np.reshape(s_w, -1)]
    if len(set(pairs)) == 1:
        mult, shift = pairs[0]
    else:
        mult, shift = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    rq = dict(mult=mult, shift=shift, zp_out=y.zero_point, lo=lo, hi=127)
    if y.wide:  # int16: lo and hi bound the high byte (lo = 0: ReLU at zero point 0)
        rq.update(dst_i16=1, zp_out=0, lo=lo if lo == -128 else lo >> 8)
    return rq


def add_multipliers(ra: float, rb: float, where: str) -> tuple[int, int, int]:
    """(mult_a, mult_b, shift) with mult_x / 2**shift ~ rx, both below 2**31, one shared shift."""
    for r in (ra, rb):
        if not r > 0 or not math.isfinite(r):
            raise CompileError(f"{where}: rescale factor {r} is not a positive number")
    _, e = math.frexp(max(ra, rb))
    shift = min(62, 31 - e)
    if shift < 0:
        raise CompileError(f"{where}: rescale factor {max(ra, rb)} is too large for the vector unit")
    ma, mb = round(ra * (1 << shift)), round(rb * (1 << shift))
    if max(ma, mb) >= 1 << 31:
        ma, mb, shift = (ma + 1) >> 1, (mb + 1) >> 1, shift - 1
    return ma, mb, shift


def requant_params(
    x: QTensor, y: QTensor, where: str, lo: float | None = None, hi: float | None = None
) -> dict:
    """VMAP fields that take `x` to `y`'s quantisation, clamped to the real range [lo, hi]. An int16
    `y`'s clamp bounds its high byte (docs/isa.md): a bound between two multiples of 256 steps is
    taken at the outer one (ReLU's 0 and the type's ends are exact)."""
    mult, shift = quant_multiplier(x.scale / y.scale, where)
    lo_q = y.qmin if lo is None else int(np.clip(np.rint(lo / y.scale) + y.zero_point, y.qmin, y.qmax))
    hi_q = y.qmax if hi is None else int(np.clip(np.rint(hi / y.scale) + y.zero_point, y.qmin, y.qmax))
    if y.wide:
        lo_q, hi_q = lo_q // 256, -((-(hi_q - 255)) // 256)
    return dict(mult=mult, shift=shift, zp_in=x.zero_point, zp_out=y.zero_point, lo=lo_q, hi=hi_q)


def rescale_params(x: QTensor, y: QTensor, where: str) -> dict | None:
    """The VMAP fields of a copy from `x` to `y` (`requant_params`), None when both are quantised
    alike and the bytes copy as they are."""
    if (x.scale, x.zero_point) == (y.scale, y.zero_point):
        return None
    return requant_params(x, y, where)


# ---- the quantiser ----------------------------------------------------------------------------------


class _DropAdvice(logging.Filter):
    """onnxruntime's quantiser logs 'please consider pre-processing' on the root logger for every
    model, and that it raises the opset for 16-bit types; the compiler does its own clean-up and
    reports the quantisation, so both are noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "pre-processing" not in message and "16-bit integer quantization natively" not in message


@contextlib.contextmanager
def _quiet_quantiser() -> Iterator[None]:
    root, f = logging.getLogger(), _DropAdvice()
    root.addFilter(f)
    try:
        yield
    finally:
        root.removeFilter(f)


def ort_session(model: onnx.ModelProto, outputs: Sequence[str] = (), optimized: bool = True):
    """onnxruntime on a float or QDQ model, with `outputs` (intermediate tensors) added to its
    outputs. Basic optimisations only: the QDQ pairs are computed as written (in float) instead of
    being fused into integer kernels, whose x86 versions without VNNI saturate 16-bit pair sums;
    the IR version capped at what onnxruntime reads. `optimized=False`: none at all (a QDQ model
    with float weights put back in place of their DequantizeLinear came out of the basic ones
    wrong: cosine 0.44 against 0.9998 unoptimised, docs/real_models.md)."""
    import onnxruntime as ort

    # The outputs and the IR version are set by appending a message that holds only them to the
    # model's bytes (parsing concatenated messages merges them: repeated fields append, a scalar's
    # last value wins), so a large model is serialised once and never copied.
    have = {o.name for o in model.graph.output}
    extra = onnx.ModelProto(
        graph=onnx.GraphProto(
            output=[onnx.ValueInfoProto(name=n) for n in dict.fromkeys(outputs) if n not in have]
        )
    )
    if model.ir_version > ORT_MAX_IR:
        extra.ir_version = ORT_MAX_IR
    so = ort.SessionOptions()
    level = ort.GraphOptimizationLevel
    so.graph_optimization_level = level.ORT_ENABLE_BASIC if optimized else level.ORT_DISABLE_ALL
    so.log_severity_level = 3  # untyped added outputs are fine; no warning for each
    so.intra_op_num_threads = ort_threads()
    data = model.SerializeToString() + extra.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def ort_threads() -> int:
    """onnxruntime's threads per session: OMP_NUM_THREADS, as numpy's BLAS takes it, when set (the
    test suite sets 1: one worker per core, docs/testing.md), else 0 (onnxruntime's default)."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() else 0


def check_calibration(calib: object, name: str, shape: list[int], source: str) -> np.ndarray:
    """Calibration samples for input `name` of `shape` (samples stacked on the batch axis) as float32;
    a CompileError names what does not fit, a warning says when the data cannot calibrate anything."""
    a = np.asarray(calib)
    if a.dtype.kind not in "biuf":
        raise CompileError(f"{source}: calibration data for {name!r} is {a.dtype}, not real numbers")
    if a.ndim != len(shape) or list(a.shape[1:]) != list(shape[1:]):
        raise CompileError(
            f"{source}: calibration data for {name!r} has shape {list(a.shape)}; the input is "
            f"{list(shape)}, so give N x {list(shape[1:])} (samples stacked on the first axis)"
        )
    a = a.astype(np.float32)
    bad = int(a.size - np.isfinite(a).sum())
    if bad:
        raise CompileError(f"{source}: calibration data for {name!r} has {bad} NaN or infinite values")
    if a.size and not a.any():
        warnings.warn(
            f"{source}: calibration data for {name!r} is all zeros: every activation range will be "
            "empty and the quantised model will be inaccurate; calibrate with representative inputs",
            CalibrationWarning,
            stacklevel=3,
        )
    return a


def calibration_feeds(calib: object, g: Graph, source: str) -> dict[str, np.ndarray]:
    """The checked calibration samples of every graph input: `calib` is one array for a model of
    one input, or a mapping from input name to array (an .npz file's arrays) for any number."""
    if isinstance(calib, Mapping):
        unknown = sorted(set(calib) - set(g.inputs))
        missing = [n for n in g.inputs if n not in calib]
        if unknown or missing:
            what = (f"; missing {missing}" if missing else "") + (f"; unknown {unknown}" if unknown else "")
            raise CompileError(
                f"{source}: calibration data are given for {sorted(calib)}, the graph inputs are "
                f"{g.inputs}{what}"
            )
        return {n: check_calibration(calib[n], n, g.shape(n, source), source) for n in g.inputs}
    if len(g.inputs) != 1:
        raise CompileError(
            f"{source}: the model has {len(g.inputs)} graph inputs {g.inputs}: give calibration data for "
            "each (a mapping from input name to samples, or an .npz file with one array per input name)"
        )
    name = g.inputs[0]
    return {name: check_calibration(calib, name, g.shape(name, source), source)}


class CalibrationWarning(UserWarning):
    """Calibration data that makes a poor quantisation."""


#: `weight_scales="auto"` quantises per output channel when per-tensor scales would leave some
#: channel of a weight with at most this fraction of the int8 range (3 bits lost)
AUTO_CHANNEL_RANGE = 1 / 8
#: channels below an eighth of one int8 step of their tensor's scale are zero either way (a dead unit)
DEAD_CHANNEL = 1 / (8 * 127)


def out_channel_axis(n: onnx.NodeProto) -> int:
    """The output-channel axis of a Conv/ConvTranspose/Gemm/MatMul node's weights (input 1): Conv's
    axis 0, ConvTranspose's axis 1, the rows of a transposed Gemm B, else B's columns (the last)."""
    if n.op_type == "ConvTranspose":
        return 1
    trans_b = any(a.name == "transB" and a.i for a in n.attribute)
    return 0 if n.op_type == "Conv" or trans_b else -1


def narrowest_channel(model: onnx.ModelProto) -> float:
    """The smallest ratio, over the Conv/Gemm/MatMul weights of a float model, of an output
    channel's largest magnitude to its tensor's (1.0: every channel uses the whole range); dead
    channels (DEAD_CHANNEL) do not count."""
    inits = {t.name: t for t in model.graph.initializer}
    worst = 1.0
    for n in model.graph.node:
        if n.op_type not in ("Conv", "Gemm", "MatMul") or len(n.input) < 2 or n.input[1] not in inits:
            continue
        w = np.abs(onnx.numpy_helper.to_array(inits[n.input[1]]).astype(np.float64))
        if w.ndim < 2 or not w.max() > 0:
            continue
        axis = out_channel_axis(n) % w.ndim
        per = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1).max(axis=1)
        per = per[per > w.max() * DEAD_CHANNEL]
        if per.size:
            worst = min(worst, float(per.min() / w.max()))
    return worst


def per_channel_choice(model: onnx.ModelProto, weight_scales: str, source: str) -> bool:
    """True when weights are to be quantised per output channel (`weight_scales` auto: when some
    channel would lose 3 bits or more to a per-tensor scale)."""
    if weight_scales not in WEIGHT_SCALES:
        raise CompileError(
            f"{source}: weight_scales must be one of {', '.join(WEIGHT_SCALES)}, not {weight_scales!r}"
        )
    if weight_scales != "auto":
        return weight_scales == "per-channel"
    return narrowest_channel(model) <= AUTO_CHANNEL_RANGE


#: `--calib-method`: how onnxruntime's calibrator picks each activation's range


def calibration_batches(model: onnx.ModelProto, calib: object, source: str) -> list[dict[str, np.ndarray]]:
    """The calibration samples as feeds of the model's batch size (each input's batch dimension)."""
    g = Graph(model, source)
    feeds = calibration_feeds(calib, g, source)
    batch = {name: g.shape(name, source)[0] for name in feeds}  # each input's batch dimension
    for name, a in feeds.items():
        if len(a) < batch[name]:
            raise CompileError(
                f"{source}: calibration data for {name!r} has {len(a)} samples, the batch is {batch[name]}"
            )
    batches = {name: len(a) // batch[name] for name, a in feeds.items()}
    if len(set(batches.values())) > 1:
        raise CompileError(
            f"{source}: the inputs' calibration data make different numbers of batches ({batches}); "
            "give the same number of samples for every input"
        )
    return [
        {name: a[i * batch[name] : (i + 1) * batch[name]] for name, a in feeds.items()}
        for i in range(min(batches.values()))
    ]


#: `--activations`: the activations' integer type (weights are int8 either way)
#: int16 activations get this many times the calibrated range: inputs unlike the calibration data
#: (a real scan after rendered pages) reach 1.4-2.8x the ranges it saw; int16 keeps the resolution
#: that headroom costs (docs/real_models.md)
INT16_HEADROOM = 2.0


def calibrated_ranges(model_path: Path, batches: list, method, source: str) -> dict[str, tuple[float, float]]:
    """Every activation's calibrated range (onnxruntime's calibrator over `batches`), by tensor."""
    from onnxruntime.quantization.calibrate import create_calibrator

    with tempfile.TemporaryDirectory() as d:
        cal = create_calibrator(model_path, augmented_model_path=str(Path(d) / "augmented.onnx"),
                                calibrate_method=method)  # fmt: skip

        class Reader:
            def __init__(self):
                self.it = iter(batches)

            def get_next(self):
                return next(self.it, None)

        cal.collect_data(Reader())
        ranges = cal.compute_data()
    out = {}
    for name in ranges.data:
        lo, hi = (float(np.asarray(v).reshape(-1)[0]) for v in ranges[name].range_value)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise CompileError(f"{source}: calibration gives tensor {name!r} the range {lo}..{hi}")
        out[name] = (lo, hi)
    return out


def _range_cache(path: Path, ranges: Mapping[str, tuple[float, float]], method) -> Path:
    """`ranges` written as onnxruntime's calibration cache (`save_tensors_data`), for `method`."""
    from onnxruntime.quantization.calibrate import TensorData, TensorsData, save_tensors_data

    data = {k: TensorData(lowest=np.float32(lo), highest=np.float32(hi)) for k, (lo, hi) in ranges.items()}
    save_tensors_data(TensorsData(method, data), path)
    return path


def calibration_method(name: str):
    """onnxruntime's CalibrationMethod for `--calib-method` `name` (CompileError naming the choices)."""
    from onnxruntime.quantization import CalibrationMethod

    methods = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
               "entropy": CalibrationMethod.Entropy}  # fmt: skip
    if name not in methods:
        raise CompileError(f"calib_method must be one of {', '.join(CALIB_METHODS)}, not {name!r}")
    return methods[name]


def calibrated_ranges_of(
    model: onnx.ModelProto, calib, calib_method: str, source: str
) -> dict[str, tuple[float, float]]:
    """calibrated_ranges for a model in memory and calibration data as quantize_float_model takes."""
    method = calibration_method(calib_method)
    batches = calibration_batches(model, calib, source)
    with tempfile.TemporaryDirectory() as d, _quiet_quantiser():
        src = Path(d) / "float.onnx"
        m = copied(model)
        m.ir_version = min(m.ir_version, ORT_MAX_IR)
        onnx.save(m, str(src))
        return calibrated_ranges(src, batches, method, source)


def clipped_tensors(model: onnx.ModelProto) -> set[str]:
    """Outputs of Clip nodes: the quantiser folds a Clip into its output's range, which must stay
    the Clip's (no int16 headroom there)."""
    return {o for n in model.graph.node if n.op_type == "Clip" for o in n.output}


def with_headroom(
    ranges: Mapping[str, tuple[float, float]], clipped: set[str]
) -> dict[str, tuple[float, float]]:
    """Each range (widened to include 0) times INT16_HEADROOM, but where a Clip bounds it."""
    out = {}
    for name, (lo, hi) in ranges.items():
        k = 1.0 if name in clipped else INT16_HEADROOM
        out[name] = (k * min(lo, 0.0), k * max(hi, 0.0))
    return out


#: operators that pass an activation's values through unchanged (its quantisation with them)
VIEW_OPS = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze"})


def matmul_operands(model: onnx.ModelProto) -> tuple[set[str], set[str]]:
    """The tensors that feed a MatMul of two activations, through the views before it: (those of its
    first operand, those of its second). The NPU multiplies them without zero points (symmetric,
    both) and the second one as the MATMUL's int8 B^T operand (compiler/ops/gemm.py)."""
    g = model.graph
    consts = {t.name for t in g.initializer} | {
        o for n in g.node if n.op_type == "Constant" for o in n.output
    }
    producer = {o: n for n in g.node for o in n.output}

    def chain(t: str) -> set[str]:
        out = {t}
        while (p := producer.get(t)) is not None and p.op_type in VIEW_OPS:
            t = p.input[0]
            out.add(t)
        return out

    first: set[str] = set()
    second: set[str] = set()
    for n in g.node:
        if n.op_type == "MatMul" and len(n.input) == 2 and not set(n.input) & consts:
            first |= chain(n.input[0])
            second |= chain(n.input[1])
    return first - second, second


def range_overrides(
    ranges: Mapping[str, tuple[float, float]], int8: set[str], clipped: set[str], sym8: set[str] = frozenset()
) -> dict:
    """onnxruntime's per-tensor overrides for a quantisation whose default is int16 (symmetric):
    every tensor's calibrated range times INT16_HEADROOM (but where a Clip bounds it), and the
    tensors in `int8` int8 (asymmetric). An int8 tensor of a mix keeps the headroom too, so that it
    is chosen only where inputs beyond the calibrated range cost no more than they cost int16. (The
    default stays symmetric so that onnxruntime keeps every Relu: one folded into an asymmetric
    range would be lost where the range is int16.) The tensors in `sym8` are int8 and symmetric
    (the second operand of a MatMul of two activations)."""
    from onnxruntime.quantization import QuantType

    out = {}
    for name, (lo, hi) in with_headroom(ranges, clipped).items():
        o = {"rmin": np.float32(lo), "rmax": np.float32(hi)}
        if name in sym8:
            o.update(quant_type=QuantType.QInt8, symmetric=True)
        elif name in int8:
            o.update(quant_type=QuantType.QInt8, symmetric=False)
        out[name] = [o]
    return out


def fold_int8_relus(model: onnx.ModelProto) -> onnx.ModelProto:
    """A Relu between two int8 tensors whose output range starts at 0 folded into that range, as
    onnxruntime folds it when every activation is int8: x -> Q -> DQ -> Relu -> Q' -> DQ' becomes
    x -> Q' -> DQ' (Q' clamps at its zero point, real 0). A mix keeps the int16 default's Relu nodes
    (compiler/precision.py), and a Relu computed after a rounding to the wider pre-Relu range would
    round twice where the NPU's producer rounds once."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in g.output}

    def int8_zp(q) -> int | None:
        zp = inits.get(q.input[2]) if len(q.input) > 2 else None
        if zp is None or zp.data_type != onnx.TensorProto.INT8:
            return None
        return int(numpy_helper.to_array(zp).reshape(-1)[0])

    drop = set()
    for r in g.node:
        if r.op_type != "Relu" or r.domain not in ("", "ai.onnx"):
            continue
        dq = producer.get(r.input[0])
        q1 = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        after = consumers.get(r.output[0], [])
        if q1 is None or q1.op_type != "QuantizeLinear" or [n.op_type for n in after] != ["QuantizeLinear"]:
            continue
        q2 = after[0]
        if int8_zp(q1) is None or int8_zp(q2) != -128 or {r.input[0], dq.input[0], r.output[0]} & outputs:
            continue
        if len(consumers.get(r.input[0], [])) != 1 or len(consumers.get(dq.input[0], [])) != 1:
            continue
        q2.input[0] = q1.input[0]
        drop.update(id(n) for n in (q1, dq, r))
    kept = [n for n in g.node if id(n) not in drop]
    del g.node[:]
    g.node.extend(kept)
    return model


def content_key(model: onnx.ModelProto, batches: list[dict[str, np.ndarray]], *extra: object) -> str:
    """A digest of a model, its calibration feeds and `extra` (options): what a quantisation step's
    result depends on, for the memos of this step and of the weight rounding."""
    h = hashlib.sha256(model.SerializeToString())
    for feed in batches:
        for k in sorted(feed):
            a = np.ascontiguousarray(feed[k])
            h.update(f"{k}|{a.dtype}|{a.shape}".encode())
            h.update(a.tobytes())
    h.update(repr(extra).encode())
    return h.hexdigest()


#: the last quantised models: compiling one model again in a process (a design-space sweep over
#: configurations, a compile with other options) skips onnxruntime's quantiser
MEMO_MODELS = 4
_memo: OrderedDict[str, bytes] = OrderedDict()
_memo_lock = threading.Lock()


#: float models converted to opset 21 (int16 quantisation needs it), by a digest of the model: the
#: int8/int16 choice quantises one model many times, and onnxruntime converts it on every call
_opset21: OrderedDict[str, bytes] = OrderedDict()
_opset21_lock = threading.Lock()


def _at_opset21(model: onnx.ModelProto, src: Path, dst: Path) -> Path:
    """`src` (the saved `model`), or where its opset is below 21, `dst` holding it converted as
    onnxruntime's quantiser converts it (`update_opset_version`: the version converter on the
    shape-inferred model, then shape inference again), which then has nothing to convert."""
    from onnxruntime.quantization.quant_utils import (
        load_model_with_shape_infer,
        save_and_reload_model_with_shape_infer,
    )

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 21)
    if opset >= 21:
        return src
    key = hashlib.sha256(src.read_bytes()).hexdigest()
    with _opset21_lock:
        raw = _opset21.get(key)
        if raw is not None:
            _opset21.move_to_end(key)
    if raw is None:
        converted = onnx.version_converter.convert_version(load_model_with_shape_infer(src), 21)
        raw = save_and_reload_model_with_shape_infer(converted).SerializeToString()
        with _opset21_lock:
            _opset21[key] = raw
            while len(_opset21) > 2:
                _opset21.popitem(last=False)
    dst.write_bytes(raw)
    return dst


def quantize_float_model(
    model: onnx.ModelProto,
    calib: np.ndarray,
    source: str = "model",
    per_channel: bool = False,
    calib_method: str = "minmax",
    activations: str = "int8",
    int16: set[str] | None = None,
    ranges: Mapping[str, tuple[float, float]] | None = None,
) -> onnx.ModelProto:
    """Static QDQ quantisation of a float model with onnxruntime, from calibration inputs;
    weights get one scale per output channel (`per_channel`) or one per tensor; activation ranges
    from `calib_method`: the extremes seen (minmax), the 99.999th percentile of magnitudes
    (percentile) or the range that keeps the histogram's entropy (entropy). `activations`: "int8"
    (asymmetric), "int16" (symmetric, INT16_HEADROOM times the calibrated ranges), or "mixed": the
    tensors in `int16` int16 and the others int8. `ranges` (calibrated_ranges), when given, are
    taken instead of calibrating again."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    method = calibration_method(calib_method)
    if activations not in ACTIVATIONS:
        raise CompileError(f"activations must be one of {', '.join(ACTIVATIONS)}, not {activations!r}")

    batches = calibration_batches(model, calib, source)
    key = quantisation_key(model, calib, source, per_channel, calib_method, activations, int16, ranges)
    if (known := memoised(key)) is not None:
        return known

    class Reader(CalibrationDataReader):
        def __init__(self, batches):
            self.it = iter(batches)

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as d, _quiet_quantiser():
        src, dst = Path(d) / "float.onnx", Path(d) / "qdq.onnx"
        model = copied(model)
        model.ir_version = min(model.ir_version, ORT_MAX_IR)  # onnxruntime lags the onnx package
        onnx.save(model, str(src))
        options = {"WeightSymmetric": True, "ActivationSymmetric": activations != "int8"}
        first, second = matmul_operands(model)
        if activations != "int8":
            if ranges is None:
                ranges = calibrated_ranges(src, batches, method, source)
            int8 = set() if activations == "int16" else set(ranges) - set(int16 or ())
            overrides = range_overrides(ranges, int8, clipped_tensors(model), second)
            for t in first:  # symmetric either way: int16 is, an int8 one is made so
                for o in overrides.get(t, []):
                    if o.get("quant_type") == QuantType.QInt8:
                        o["symmetric"] = True
            options["TensorQuantOverrides"] = overrides
        elif first | second:  # int8: the operands of a product of two activations symmetric
            options["TensorQuantOverrides"] = {t: [{"symmetric": True}] for t in first | second}
        if activations != "int8":  # int16 tensors need opset 21: converted once per model, not per call
            src = _at_opset21(model, src, Path(d) / "float21.onnx")
        cache = {}
        takes_cache = "calibration_cache_path" in inspect.signature(quantize_static).parameters
        if activations != "int8" and takes_cache:
            # every range is given: onnxruntime (where quantize_static has the option) takes them as its
            # calibration cache instead of calibrating again, whose graph surgery grows with the square of the
            # nodes (an unrolled recurrent layer's thousands: docs/compiler.md)
            cache["calibration_cache_path"] = _range_cache(Path(d) / "ranges.json", ranges, method)
        quantize_static(
            str(src),
            str(dst),
            # every range is given: one batch is enough for the calibrator onnxruntime runs anyway
            Reader(batches if activations == "int8" else batches[:1]),
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            calibrate_method=method,
            activation_type=QuantType.QInt8 if activations == "int8" else QuantType.QInt16,
            weight_type=QuantType.QInt8,
            extra_options=options,
            **cache,
        )
        qdq = onnx.load(str(dst))
        if activations == "mixed":
            qdq = fold_int8_relus(qdq)
        qdq = infer_in_place(qdq)
    remember(key, qdq)
    return qdq


def quantisation_key(
    model: onnx.ModelProto, calib, source: str = "model", per_channel: bool = False,
    calib_method: str = "minmax", activations: str = "int8", int16: set[str] | None = None,
    ranges: Mapping[str, tuple[float, float]] | None = None,
) -> str:  # fmt: skip
    """The memo key of `quantize_float_model` with these arguments."""
    batches = calibration_batches(model, calib, source)
    spans = None if ranges is None else sorted((k, float(lo), float(hi)) for k, (lo, hi) in ranges.items())
    asked = (per_channel, calibration_method(calib_method), activations, sorted(int16 or ()), spans)
    return content_key(model, batches, *asked, INT16_HEADROOM)


def is_kept(key: str) -> bool:
    """Whether a quantised model is kept under `key`."""
    with _memo_lock:
        return key in _memo


def memoised(key: str) -> onnx.ModelProto | None:
    """A copy of the quantised model kept under `key` (callers edit what they get), or None."""
    with _memo_lock:
        if key not in _memo:
            return None
        _memo.move_to_end(key)
        return onnx.ModelProto.FromString(_memo[key])


def remember(key: str, qdq: onnx.ModelProto) -> None:
    """Keep a quantised model under `key` (the last MEMO_MODELS)."""
    with _memo_lock:
        _memo[key] = qdq.SerializeToString()
        while len(_memo) > MEMO_MODELS:
            _memo.popitem(last=False)
