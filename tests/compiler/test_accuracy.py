"""The accuracy guard (compiler/accuracy.py): a compiled float model is checked against onnxruntime
float on calibration samples; one below --target-cosine is repaired (operators to the host) or
refused with the operators named, never returned silently."""

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu.compiler import compile_onnx
from npu.compiler.accuracy import CheckData, cosine, hold_back, split_loss, weights_only
from npu.compiler.errors import AccuracyError
from tests.compiler.helpers import ort_outputs

N, WIN, HOP, MELS = 4096, 256, 128, 32


def logmel_model() -> onnx.ModelProto:
    """An audio front end: a short-time Fourier transform as a 1-D convolution (cosine and sine
    rows under a Hann window), squared, a mel projection (of re^2 + im^2), a floor and a log."""
    f = WIN // 2 + 1
    t, k = np.arange(WIN), np.arange(f)[:, None]
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * t / WIN)
    w = np.concatenate([np.cos(2 * np.pi * k * t / WIN) * hann, -np.sin(2 * np.pi * k * t / WIN) * hann])
    mel = np.zeros((f, MELS))
    edges = np.linspace(0, f - 1, MELS + 2)
    bins = np.arange(f)
    for m in range(MELS):
        lo, c, hi = edges[m : m + 3]
        mel[:, m] = np.clip(np.minimum((bins - lo) / (c - lo), (hi - bins) / (hi - c)), 0, None)
    nodes = [
        helper.make_node("Conv", ["audio", "w"], ["spec"], name="stft", strides=[HOP], kernel_shape=[WIN]),
        helper.make_node("Mul", ["spec", "spec"], ["power"], name="square"),
        helper.make_node("Transpose", ["power"], ["power_t"], name="frames_first", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["power_t", "mel"], ["melspec"], name="mel"),
        helper.make_node("Add", ["melspec", "eps"], ["mel_eps"], name="floor"),
        helper.make_node("Log", ["mel_eps"], ["logmel"], name="log"),
    ]
    frames = (N - WIN) // HOP + 1
    g = helper.make_graph(
        nodes,
        "logmel",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 1, N])],
        [helper.make_tensor_value_info("logmel", TensorProto.FLOAT, [1, frames, MELS])],
        [
            numpy_helper.from_array(w[:, None, :].astype(np.float32), "w"),
            numpy_helper.from_array(np.concatenate([mel, mel]).astype(np.float32), "mel"),
            numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def tones(k: int, seed: int) -> np.ndarray:
    """Decaying two-partial tones in a little noise (the quiet tails are what a log brings out)."""
    rng = np.random.default_rng(seed)
    t = np.arange(N) / 16000
    out = []
    for _ in range(k):
        f0 = rng.uniform(100, 2000)
        x = 0.5 * np.sin(2 * np.pi * f0 * t) + 0.2 * np.sin(2 * np.pi * 3.1 * f0 * t)
        out.append(((x + rng.normal(0, 0.01, N)) * np.exp(-t * rng.uniform(0, 20)))[None])
    return np.array(out, np.float32)


@pytest.fixture(scope="module")
def logmel(tmp_path_factory):
    path = tmp_path_factory.mktemp("logmel") / "logmel.onnx"
    onnx.save(logmel_model(), str(path))
    return path


def _cosines(cm, model, x) -> list[float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # log(0) of the unrepaired model
        return [cosine(cm.run(x[i : i + 1])[0], ort_outputs(model, x[i : i + 1])[0]) for i in range(len(x))]


def test_an_audio_front_end_below_the_target_is_repaired(logmel):
    """Without the guard the compiled log-mel front end is far from float on new audio (its floor
    and log read a mel spectrum quantised to zero in the quiet frames); with it (the default) the
    compile moves the operators that lose accuracy to the host and says so in the report, and new
    audio reaches the target."""
    model, calib, new = logmel_model(), tones(16, seed=0), tones(4, seed=99)
    unchecked = compile_onnx(logmel, calib=calib, accuracy_check=False)
    assert unchecked.accuracy is None and "accuracy: not checked" in unchecked.report()
    assert min(_cosines(unchecked, model, new)) < 0.99
    cm = compile_onnx(logmel, calib=calib)
    acc = cm.accuracy
    assert acc.held_back and acc.samples == 2 and acc.worst >= 0.99, acc
    assert "floor" in acc.moved and "accuracy guard" in acc.moved["floor"]
    placed = {la.node: la.placement for la in cm.lowered.layers}
    assert all(placed[n] == "host" for n in acc.moved)
    assert "repaired by moving floor" in cm.report()
    assert min(_cosines(cm, model, new)) >= 0.99


def test_progress_names_each_stage_and_the_repair_rounds(logmel):
    """`compile_onnx(progress=...)` (what `npu compile` prints on a terminal): one line a stage,
    in order, with the seconds since the start; each repair round lowers again. The guard checks
    builds without the order search and the points (the values do not depend on them): the order is
    searched once, for the build it accepts."""
    lines: list[str] = []
    compile_onnx(logmel, calib=tones(16, seed=0), progress=lines.append)
    stages = [line.split("s  ", 1)[1] for line in lines]
    order = ["loading", "quantising", "lowering", "assembling (values only)", "accuracy check", "searching"]
    assert [next(s for s in stages if s.startswith(w)) for w in order] and stages[-1] == "done"
    firsts = [min(i for i, s in enumerate(stages) if s.startswith(w)) for w in order]
    assert firsts == sorted(firsts), stages
    assert sum(s.startswith("searching") for s in stages) == 1, stages
    assert stages[-2].startswith("assembling programs and placing cancellation points"), stages
    assert sum("moved to the host by the accuracy guard" in s for s in stages) == 3, stages
    secs = [float(line.split(" s ", 1)[0]) for line in lines]
    assert secs == sorted(secs)


def test_a_model_that_cannot_be_repaired_is_refused_naming_the_operators(logmel):
    """A target no placement reaches: an AccuracyError with the output, its cosine, the operators
    losing the most and what the repair tried."""
    with pytest.raises(AccuracyError) as e:
        compile_onnx(logmel, calib=tones(16, seed=0), target_cosine=1.0)
    msg = str(e.value)
    assert "output 'logmel'" in msg and "below the target 1" in msg
    assert "the operators losing the most: log (Log)" in msg and "did not reach it" in msg
    # where the loss is: the log of quantised power spectra (activations), not the weights
    assert "with only the weights quantised" in msg and "the activations' quantisation loses it" in msg, msg


def gemm_model(w: np.ndarray) -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], name="fc")],
        "fc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, w.shape[1]])],
        [numpy_helper.from_array(w.astype(np.float32), "w")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_the_loss_is_split_between_weights_and_activations(tmp_path):
    """split_loss tells a model whose int8 weights lose the accuracy (one weight 1000 times the
    others under one scale per tensor rounds the rest to zero) from one whose weights are fine."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(16, 64)).astype(np.float32)
    check = CheckData([{"x": x[i : i + 1]} for i in (14, 15)], [[x[i : i + 1]] for i in (14, 15)], True)
    spiky = rng.normal(size=(64, 32)) * 0.01
    spiky[0, 0] = 10.0
    for w, weights_lose in ((spiky, True), (rng.normal(size=(64, 32)), False)):
        model = gemm_model(w)
        onnx.save(model, tmp_path / "fc.onnx")
        path = tmp_path / "fc.onnx"
        cm = compile_onnx(path, calib=x[:14], weight_scales="per-tensor", accuracy_check=False)
        split = split_loss(cm.qdq, model, check)
        assert split.activations > 0.999, split
        assert (split.weights < 0.99) == weights_lose, split
        if weights_lose:
            assert "the int8 weights lose it" in split.describe(), split.describe()
    # the NPU well below its QDQ model: its own arithmetic, not quantisation
    assert "the NPU's arithmetic" in type(split)(0.9999, 0.9999, 1.0, npu=0.95).describe()


def test_check_samples_are_held_back_from_eight_batches_else_reused():
    model = logmel_model()
    many, check = hold_back(model, tones(16, seed=1), {}, "m")
    assert len(many) == 14 and check.held_back and check.samples == 2
    few, check = hold_back(model, tones(4, seed=1), {}, "m")
    assert len(few) == 4 and not check.held_back and check.samples == 2
    # data that do not match the input are left to the quantiser's error message
    bad = np.zeros((16, 3, N), np.float32)
    assert hold_back(model, bad, {}, "m") == (bad, None)


def test_cosine_counts_a_non_finite_mismatch_as_no_match():
    a = np.array([1.0, 2.0, 3.0])
    assert cosine(a, a) == pytest.approx(1.0)
    assert cosine(np.array([1.0, -np.inf, 3.0]), a) == 0.0
    assert cosine(np.array([1.0, -np.inf, 3.0]), np.array([1.0, -np.inf, 3.0])) == pytest.approx(1.0)


def test_only_the_weights_quantised_keeps_what_int8_ranges_fold(tmp_path):
    """The weights' share of the loss on an int8 model: a ResNet's Relus live in its int8 ranges
    (the quantiser folds them), so its weights alone are measured in the float model, not by
    passing the QDQ model's activation pairs through (which measured cosine -0.002)."""
    from npu.models import zoo

    z = zoo.ZOO["resnet_small"]()
    path = tmp_path / "resnet.onnx"
    onnx.save(z.model, path)
    calib, check = hold_back(z.model, z.calib, {}, str(path))
    cm = compile_onnx(path, calib=calib, activations="int8", accuracy_check=False)
    assert weights_only(cm.qdq, z.model, check) >= 0.999
    split = split_loss(cm.qdq, z.model, check)
    assert split.weights >= 0.999 and split.qdq < split.weights, split
