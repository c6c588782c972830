"""`--weight-rounding gptq` (compiler/rounding.py): each layer's int8 weights chosen to lower its
output error on the calibration inputs. The rounding alone lowers a layer's error for correlated
inputs; a compiled model keeps the quantiser's scales and changes only int8 weight values, runs on
the NPU exactly as onnxruntime runs the rounded QDQ graph, and comes out closer to the float model
on held-out inputs."""

import numpy as np
import onnx
import pytest

from npu.cli import main
from npu.compiler import compile_onnx
from npu.compiler.graph import CompileError
from npu.compiler.rounding import gptq
from npu.models.builder import Net
from tests.compiler.helpers import compare_int8, ort_outputs


def _error(w, s, q, h):
    e = w - q.astype(np.float64) * s[:, None]
    return float(np.einsum("rd,de,re->", e, h, e))


def test_gptq_lowers_the_output_error_of_correlated_inputs():
    rng = np.random.default_rng(0)
    mix = rng.normal(0, 1, (64, 64))
    x = rng.normal(0, 1, (2048, 64)) @ mix  # correlated columns, as neighbouring pixels are
    x[:, 5] = 0.0  # an input that is never non-zero
    h = x.T @ x
    w = rng.normal(0, 0.1, (24, 64))
    s = np.abs(w).max(axis=1) / 127
    nearest = np.clip(np.round(w / s[:, None]), -128, 127).astype(np.int8)
    q = gptq(w, s, h)
    assert q.dtype == np.int8 and q.shape == w.shape
    assert (q[:, 5] == nearest[:, 5]).all()  # an input calibration never saw: nearest rounding
    assert np.abs(q.astype(int) - nearest).max() <= 3  # still the weights, rounded differently
    assert _error(w, s, q, h) < 0.75 * _error(w, s, nearest, h)  # measured: 0.55x


def _smooth(rng, n, shape):
    """Images of low spatial frequency: neighbouring pixels correlate, as in photos."""
    c, h, w = shape
    small = rng.normal(0, 1, (n, c, h // 4, w // 4))
    return np.kron(small, np.ones((1, 1, 4, 4))).astype(np.float32) + rng.normal(0, 0.1, (n, c, h, w)).astype(
        np.float32
    )


@pytest.fixture(scope="module")
def rounded(tmp_path_factory):
    net = Net("rounding", (1, 3, 16, 16), seed=5)
    y = net.conv(net.input, 16, 3, bn=True)
    y = net.conv(y, 16, 3, groups=16)  # depthwise
    y = net.conv(y, 24, 3, stride=2)
    y = net.gemm(net.flatten(net.gap(y)), 10)
    model = net.model([y])
    path = tmp_path_factory.mktemp("rounding") / "m.onnx"
    onnx.save(model, str(path))
    rng = np.random.default_rng(1)
    calib, held = _smooth(rng, 32, (3, 16, 16)), _smooth(rng, 8, (3, 16, 16))
    cms = {
        # the rounding alone
        r: compile_onnx(path, "tiny", calib=calib, weight_rounding=r, bias_correction=False)
        for r in ("nearest", "gptq")
    }
    return model, path, cms, held


def _inits(m):
    return {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}


def test_only_int8_weight_values_change(rounded):
    _model, _path, cms, _held = rounded
    a, b = _inits(cms["nearest"].qdq), _inits(cms["gptq"].qdq)
    assert a.keys() == b.keys()
    changed = [k for k in a if not np.array_equal(a[k], b[k])]
    assert changed and all(a[k].dtype == np.int8 for k in changed), changed
    assert "GPTQ in " in cms["gptq"].quantisation
    assert [la.placement for la in cms["gptq"].lowered.layers] == [
        la.placement for la in cms["nearest"].lowered.layers
    ]


def test_npu_runs_the_rounded_graph_exactly(rounded):
    _model, _path, cms, held = rounded
    for i in range(2):
        compare_int8(cms["gptq"], held[i : i + 1])


def test_closer_to_the_float_model(rounded):
    model, _path, cms, held = rounded
    err = {}
    for r, cm in cms.items():
        e = []
        for i in range(len(held)):
            (want,) = ort_outputs(model, held[i : i + 1])
            (got,) = cm.run(held[i : i + 1])
            e.append(np.sum((got.reshape(want.shape) - want) ** 2) / np.sum(want**2))
        err[r] = float(np.mean(e))
    assert err["gptq"] < err["nearest"], err


def test_auto_keeps_gptq_only_when_the_model_gains(rounded, monkeypatch):
    _model, path, cms, held = rounded
    rng = np.random.default_rng(1)
    calib = _smooth(rng, 32, (3, 16, 16))  # the fixture's calibration inputs
    auto = compile_onnx(path, "tiny", calib=calib, bias_correction=False)  # the default rounding
    assert "the model's" in auto.quantisation, auto.quantisation
    assert _inits(auto.qdq).keys() == _inits(cms["gptq"].qdq).keys()
    assert all(np.array_equal(v, _inits(cms["gptq"].qdq)[k]) for k, v in _inits(auto.qdq).items())
    monkeypatch.setattr("npu.compiler.rounding.AUTO_MARGIN", 0.0)  # no gain is enough
    kept = compile_onnx(path, "tiny", calib=calib, bias_correction=False)
    assert "weights rounded to nearest" in kept.quantisation, kept.quantisation
    assert all(np.array_equal(v, _inits(cms["nearest"].qdq)[k]) for k, v in _inits(kept.qdq).items())


def test_unknown_rounding_is_refused(rounded):
    _model, path, _cms, held = rounded
    msg = "weight_rounding must be one of auto, nearest, gptq, not 'adaround'"
    with pytest.raises(CompileError, match=msg):
        compile_onnx(path, "tiny", calib=held, weight_rounding="adaround")


def test_command_line(rounded, tmp_path, capsys):
    _model, path, _cms, held = rounded
    np.save(tmp_path / "calib.npy", held)
    args = ["compile", str(path), "-o", str(tmp_path / "m.npub"), "--calib", str(tmp_path / "calib.npy")]
    assert main(args + ["--config", "tiny", "--weight-rounding", "gptq", "--report"]) == 0
    assert "weights rounded by GPTQ in" in capsys.readouterr().out


def test_a_model_rounded_again_on_the_same_data_comes_from_the_memo(rounded, monkeypatch):
    """The rounding of a float model on given calibration data is kept (per layer: its input, int8
    weights and scales): a repeat compile and the same weights under int16 activations (`auto`'s
    retry) skip the Hessians and take the same weights; other data are rounded afresh."""
    _model, path, cms, _held = rounded
    calib = _smooth(np.random.default_rng(1), 32, (3, 16, 16))  # the fixture's calibration inputs
    compile_onnx(path, "tiny", calib=calib, weight_rounding="gptq")  # kept, if another test evicted it

    def gathered(*_a, **_k):
        raise AssertionError("the Hessians were gathered again")

    monkeypatch.setattr("npu.compiler.rounding._hessians", gathered)
    for activations in ("int8", "int16"):
        again = compile_onnx(path, "tiny", calib=calib, weight_rounding="gptq", activations=activations)
        assert "GPTQ in " in again.quantisation, again.quantisation
        weights = {k: v for k, v in _inits(cms["gptq"].qdq).items() if v.dtype == np.int8}
        assert all(np.array_equal(v, _inits(again.qdq)[k]) for k, v in weights.items()), activations
    with pytest.raises(CompileError, match="gathered again"):
        compile_onnx(path, "tiny", calib=calib[:16], weight_rounding="gptq", activations="int8")


def test_a_model_quantised_again_comes_from_the_memo(monkeypatch):
    """onnxruntime's quantiser runs once for a model, its calibration data and the options; a copy
    comes back each time (editing it leaves the memo as it was)."""
    from npu.compiler.quantize import quantize_float_model

    net = Net("memo", (1, 3, 8, 8), seed=3)
    model = net.model([net.conv(net.input, 8, 3)])
    calib = np.random.default_rng(3).normal(size=(4, 3, 8, 8)).astype(np.float32)
    first = quantize_float_model(model, calib, "memo")
    first.graph.node.pop()  # the caller's copy only

    def quantiser(*_a, **_k):
        raise AssertionError("quantised again")

    monkeypatch.setattr("onnxruntime.quantization.quantize_static", quantiser)
    again = quantize_float_model(model, calib, "memo")
    assert len(again.graph.node) == len(first.graph.node) + 1
    with pytest.raises(AssertionError, match="quantised again"):
        quantize_float_model(model, calib, "memo", activations="int16")


def test_layers_with_too_few_inputs_are_not_gathered(rounded, monkeypatch):
    """A layer the calibration data give fewer than MIN_SAMPLES input vectors per weight column
    keeps nearest rounding, so its Hessian is not gathered (from the inferred shapes, before any
    onnxruntime pass): the head Gemm here sees one vector per sample. Gathering every layer gives
    the same weights."""
    from collections import OrderedDict

    from npu.compiler import rounding

    _model, path, _cms, _held = rounded
    calib = _smooth(np.random.default_rng(1), 32, (3, 16, 16))
    got = {}
    real = rounding._hessians

    def spy(layers, *a, **k):
        hs, counts, outs = real(layers, *a, **k)
        got.update(
            {
                la.node.op_type + str(i): h is not None
                for i, (la, h) in enumerate(zip(layers, hs, strict=True))
            }
        )
        return hs, counts, outs

    monkeypatch.setattr(rounding, "_hessians", spy)
    monkeypatch.setattr(rounding, "_memo", OrderedDict())
    lean = compile_onnx(path, "tiny", calib=calib, weight_rounding="gptq")
    assert [k for k, v in got.items() if not v] == ["Gemm3"]
    monkeypatch.setattr(rounding, "_memo", OrderedDict())
    monkeypatch.setattr(rounding, "_worth_gathering", lambda layers, *_: [True] * len(layers))
    full = compile_onnx(path, "tiny", calib=calib, weight_rounding="gptq")
    assert all(got.values())
    assert _inits(lean.qdq).keys() == _inits(full.qdq).keys()
    assert all(np.array_equal(v, _inits(full.qdq)[k]) for k, v in _inits(lean.qdq).items())


@pytest.fixture(scope="module")
def biased(tmp_path_factory):
    """A convolutional net with coarse (per-tensor) int8 weights and int16 activations, on inputs
    with a mean of their own (a bright image): compiled with and without the bias correction."""
    net = Net("bias", (1, 8, 16, 16), seed=7)
    y = net.conv(net.input, 16, 3, bn=True)
    y = net.conv(y, 16, 1)
    y = net.conv(y, 8, 3)
    model = net.model([y])
    path = tmp_path_factory.mktemp("bias") / "m.onnx"
    onnx.save(model, str(path))
    rng = np.random.default_rng(2)
    calib, held = (_smooth(rng, n, (8, 16, 16)) + 2.0 for n in (16, 6))
    opts = dict(
        activations="int16", weight_scales="per-tensor", weight_rounding="nearest", accuracy_check=False
    )
    cms = {bc: compile_onnx(path, "tiny", calib=calib, bias_correction=bc, **opts) for bc in (False, True)}
    return model, cms, held


def test_bias_correction_changes_only_int32_biases(biased):
    _model, cms, _held = biased
    a, b = _inits(cms[False].qdq), _inits(cms[True].qdq)
    changed = [k for k in a if not np.array_equal(a[k], b[k])]
    assert changed and all(a[k].dtype == np.int32 for k in changed), changed
    assert "biases corrected for the weights' rounding in 3 of 3 layers" in cms[True].quantisation


def test_the_npu_runs_the_corrected_graph_exactly(biased):
    _model, cms, held = biased
    compare_int8(cms[True], held[:1])


def test_bias_correction_removes_the_mean_error(biased):
    """The outputs' mean error per channel on held-out inputs (what the correction targets) falls,
    and the whole error with it."""
    model, cms, held = biased
    mean_err, err = {}, {}
    for bc, cm in cms.items():
        d = []
        for i in range(len(held)):
            (want,) = ort_outputs(model, held[i : i + 1])
            (got,) = cm.run(held[i : i + 1])
            d.append(got.reshape(want.shape) - want)
        d = np.concatenate(d)
        mean_err[bc] = float(np.abs(d.mean(axis=(0, 2, 3))).mean())
        err[bc] = float(np.mean(d**2))
    assert mean_err[True] < 0.5 * mean_err[False], mean_err
    assert err[True] < err[False], err


def test_layers_reading_int8_are_not_corrected(biased, tmp_path):
    model, _cms, held = biased
    onnx.save(model, str(tmp_path / "m.onnx"))
    cm = compile_onnx(tmp_path / "m.onnx", "tiny", calib=held, activations="int8", accuracy_check=False)
    assert "biases corrected for the weights' rounding in 0 of 0 layers" in cm.quantisation
