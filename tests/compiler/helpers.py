"""Compile a float model, run it on the golden model and on onnxruntime's QDQ model, compare int8."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from npu.compiler import compile_onnx
from npu.compiler.ops.registry import is_fused
from npu.compiler.quantize import ort_threads
from npu.container import HostTensor


def compile_model(
    tmp_path, model: onnx.ModelProto, config: str, calib: np.ndarray, name: str = "m", **options
):
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    options.setdefault("activations", "int8")  # the operator tests check the int8 datapath
    return compile_onnx(path, config, calib=calib, **options)


def ort_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """onnxruntime as the exact reference for a QDQ model. On x86 CPUs without VNNI its default
    u8 x s8 integer GEMM (the QGemm it fuses QDQ pairs into) adds product pairs in saturating 16-bit
    lanes, which this machine's EPYC shows as errors of up to 13 int8 steps; the documented session
    option `session.x64quantprecision` selects its exact kernel (it changes nothing elsewhere)."""
    so = ort.SessionOptions()
    so.add_session_config_entry("session.x64quantprecision", "1")
    if _int16_qdq(model):
        # its fusions of int16 QDQ pairs are not exact (a MatMul of int16 activations off by up to
        # 65 of their steps); unfused, every node runs as the QDQ graph defines it
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = ort_threads()
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except ort.capi.onnxruntime_pybind11_state.Fail as e:
        # its extended fusions fail on a weight shared by many MatMuls (an unrolled recurrent
        # layer's: "Attempt to replace the existing tensor"); the basic level runs the QDQ graph
        # as it defines it, DequantizeLinear -> float MatMul -> QuantizeLinear, which is exact
        if "replace the existing tensor" not in str(e):
            raise
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def unfused_layers(cm) -> list[tuple[str, str]]:
    """(op, placement) of the compiled layers, without the Relus an int16 producer's
    requantisation computed (views: onnxruntime keeps such a Relu as a node, where it folds an
    int8 one into the quantised range), so that a graph's layers read the same for both types; an
    Add its producer computes in its output pass (a residual) and a convolution computed beside
    its pair (compiler/ops/conv.py `paired_conv`) read "npu"."""
    out = []
    for la in cm.lowered.layers:
        if (la.op, la.placement) != ("Relu", "view"):
            out.append((la.op, "npu" if la.op in ("Add", "Sum", "Conv") and on_npu(la) else la.placement))
    return out


def dram_bytes(cm, config: str) -> int:
    """Bytes a compiled model's program moves through DRAM (read and written) on the golden model."""
    from npu.sim.golden.runner import timing_run

    c = timing_run(config, cm.lowered.program).counter_values()
    return c["DMA_RD_BYTES"] + c["DMA_WR_BYTES"]


def assert_same_int8(a, b, *inputs: np.ndarray) -> None:
    """Two compiles of one model (`CompiledModel`) give the same int8 outputs, bit for bit."""
    for got, want in zip(a.run_int8(*inputs), b.run_int8(*inputs), strict=True):
        assert np.array_equal(got, want)


def assert_pauses_bit_exact(low, urgent, x: np.ndarray, config: str = "default") -> None:
    """`low` paused at every one of its cancellation points, `urgent` run in each pause, then
    resumed: every point taken, and the same outputs as `urgent`'s (the same model without the
    points) bit for bit."""
    from npu.driver import Npu
    from npu.driver.bench import preempt_at_every_point

    npu = Npu("model", config)
    lo, hi = npu.load(low.to_container(), "low"), npu.load(urgent.to_container(), "urgent")
    got, records = preempt_at_every_point(npu, lo, x, hi, x)
    assert len(records) == len(low.lowered.points)
    for a, b in zip(got, urgent.run_int8(x), strict=True):
        assert np.array_equal(a, b)


def on_npu(la) -> bool:
    """Whether the NPU computes a layer: its own program, or its producer's output pass (a table
    function, a residual Add: a view naming the producer)."""
    return la.placement == "npu" or is_fused(la)


def _int16_qdq(model: onnx.ModelProto) -> bool:
    """Whether some QuantizeLinear of `model` quantises to 16 bits."""
    types = {i.name: i.data_type for i in model.graph.initializer}
    wide = {onnx.TensorProto.INT16, onnx.TensorProto.UINT16}
    return any(n.op_type == "QuantizeLinear" and len(n.input) > 2 and types.get(n.input[2]) in wide
               for n in model.graph.node)  # fmt: skip


def ort_outputs(model: onnx.ModelProto, *xs: np.ndarray) -> list[np.ndarray]:
    sess = ort_session(model)
    return sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), xs, strict=True)})


def compare_int8(cm, *xs: np.ndarray) -> list[np.ndarray]:
    """Per output: |NPU - onnxruntime(QDQ)| in int8 (or int16) steps; asserts the issue's 1-LSB/99%
    rule (4 int16 steps for int16 outputs)."""
    got = cm.run_int8(*xs)
    want = ort_outputs(cm.qdq, *xs)
    diffs = []
    for g, w, t in zip(got, want, cm.lowered.outputs, strict=True):
        if isinstance(t, HostTensor):
            assert np.allclose(g, w, atol=1e-5), t.name
            continue
        if t.scales is not None:
            # int32 accumulators: the QDQ graph's value before its final rounding; an input one step
            # off moves it by less than one step of a symmetric int8 scale fitted to the output
            s = np.asarray(t.scales).reshape([-1 if d == 1 else 1 for d in range(g.ndim)])
            assert g.dtype == np.int32, (t.name, g.dtype)
            d = np.abs(g * s - w) / (np.abs(w).max() / 127 + 1e-30)
            assert (d <= 1).mean() >= 0.99, (t.name, d.max(), (d <= 1).mean())
            diffs.append(d)
            continue
        lim = 1 << (8 * t.layout.elem - 1)  # int8 or int16 steps
        wq = np.clip(np.rint(w / t.scale) + t.zero_point, -lim, lim - 1)
        d = np.abs(g.astype(int) - wq.astype(int))
        # int16: each operator rounds once as in int8, and a few roundings' worth of int16 steps is
        # 1/64 of one int8 step: the rule is 4 steps there
        tol = 1 if t.layout.elem == 1 else 4
        assert (d <= tol).mean() >= 0.99, (t.name, d.max(), (d <= tol).mean())
        diffs.append(d)
    return diffs


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))
