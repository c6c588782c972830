"""Graph outputs at full precision (compiler/outputs.py): a Gemm read only as a graph output or by
host operators stores its int32 accumulators, dequantised on the host with one scale per column."""

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npu.cli import main
from npu.compiler import compile_onnx
from npu.container import Container, HostTensor
from npu.sim.golden.runner import run_container
from tests.compiler.helpers import compare_int8, cosine, ort_outputs


def classifier(
    path, softmax: bool, extra_reader: bool = False, hidden: bool = True, seed: int = 3, reshape: bool = False
):
    """x (4 x 32) [-> Gemm -> Relu] -> Gemm (logits, 10) [-> Softmax [-> Reshape]] [and logits -> Gemm]."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.25, (32, 48)).astype(np.float32), "w0"),
        numpy_helper.from_array(rng.normal(0, 0.1, 48).astype(np.float32), "b0"),
        numpy_helper.from_array(rng.normal(0, 0.3, (48, 10)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.3, (10, 6)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w0", "b0"], ["h"], name="fc0"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w1", "b1"], ["logits"], name="fc1"),
    ]
    if not hidden:
        inits[2] = numpy_helper.from_array(rng.normal(0, 0.3, (32, 10)).astype(np.float32), "w1")
        nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["logits"], name="fc1")]
    outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [4, 10])]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["logits"], ["p"], name="softmax", axis=1))
        outs = [helper.make_tensor_value_info("p", TensorProto.FLOAT, [4, 10])]
    if softmax and reshape:  # as old classifiers end: the probabilities reshaped to N x C x 1 x 1
        inits.append(numpy_helper.from_array(np.array([4, 10, 1, 1], np.int64), "shape"))
        nodes.append(helper.make_node("Reshape", ["p", "shape"], ["prob"], name="reshape"))
        outs = [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [4, 10, 1, 1])]
    if extra_reader:  # an NPU operator reads the logits too: they must stay int8
        nodes.append(helper.make_node("MatMul", ["logits", "w2"], ["z"], name="fc2"))
        outs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 6]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])
    g = helper.make_graph(nodes, "cls", [x], outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.save(m, str(path))
    return path, m


def float_out(m, x):
    return ort_outputs(m, x)


def test_logits_output_is_int32_and_not_clipped(tmp_path):
    path, m = classifier(tmp_path / "c.onnx", softmax=False, hidden=False)
    rng = np.random.default_rng(1)
    calib = rng.normal(0, 0.5, (32, 32)).astype(np.float32)
    wide = compile_onnx(path, "tiny", calib=calib)
    narrow = compile_onnx(path, "tiny", calib=calib, output_precision="int8")
    t = wide.lowered.outputs[0]
    assert t.scales is not None and len(t.scales) == 10 and t.layout.elem == 4
    assert narrow.lowered.outputs[0].scales is None
    assert any("int32 accumulators" in note for note in wide.frontend)
    assert "output logits: int32" in wide.report()
    compare_int8(wide, calib[:4])  # against onnxruntime running the same graph (pair removed)
    compare_int8(narrow, calib[:4])
    # inputs inside the calibrated range, lined up with the weights of one class each: logits
    # beyond anything calibration saw saturate in int8, not in the accumulators
    w1 = numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == "w1"))
    x = (0.8 * np.abs(calib).max() * np.sign(w1[:, :4].T)).astype(np.float32)
    want = float_out(m, x)[0]
    got_wide, got_narrow = wide.run(x)[0], narrow.run(x)[0]
    assert np.abs(got_narrow).max() < 0.8 * np.abs(want).max()  # clipped at the calibrated scale
    err_wide = np.abs(got_wide - want).max()
    assert err_wide < 0.5 * np.abs(got_narrow - want).max()
    assert cosine(got_wide, want) > 0.99


def test_host_softmax_reads_the_accumulators(tmp_path):
    path, m = classifier(tmp_path / "s.onnx", softmax=True)
    calib = np.random.default_rng(2).normal(0, 0.5, (32, 32)).astype(np.float32)
    cm = compile_onnx(path, "default", calib=calib)
    assert isinstance(cm.lowered.outputs[0], HostTensor)
    host = [s for s in cm.lowered.segments if s.kind == "host"]
    assert len(host) == 1 and host[0].inputs[0].tensor.scales is not None  # Softmax reads int32
    x = calib[:4]
    got = cm.run(x)[0]
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)
    assert cosine(got, float_out(m, x)[0]) > 0.999


def test_probabilities_reshaped_as_the_output_stay_float(tmp_path):
    """Softmax -> Reshape as the graph output: the Reshape moves to the host with the Softmax, so
    the probabilities are not rounded to int8 (steps of 1/255: the small ones became 0)."""
    path, m = classifier(tmp_path / "r.onnx", softmax=True, reshape=True)
    calib = np.random.default_rng(2).normal(0, 0.5, (32, 32)).astype(np.float32)
    cm = compile_onnx(path, "default", calib=calib)
    assert isinstance(cm.lowered.outputs[0], HostTensor)
    host = [s for s in cm.lowered.segments if s.kind == "host"]
    assert host and host[0].inputs[0].tensor.scales is not None  # Softmax reads int32
    x = calib[:4]
    got, want = cm.run(x)[0], float_out(m, x)[0]
    assert got.shape == (4, 10, 1, 1)
    steps = got * 255  # int8 probabilities (scale 1/255) would all be whole steps
    assert np.abs(steps - np.round(steps)).max() > 0.1
    assert cosine(got, want) > 0.999
    assert "output prob: float (host)" in cm.report()


def test_logits_read_by_the_npu_stay_int8(tmp_path):
    path, _ = classifier(tmp_path / "e.onnx", softmax=False, extra_reader=True)
    calib = np.random.default_rng(4).normal(0, 0.5, (32, 32)).astype(np.float32)
    cm = compile_onnx(path, "tiny", calib=calib)
    scales = {t.name: t.scales for t in cm.lowered.outputs}
    assert scales["logits"] is None  # fc2 on the NPU reads the int8 logits
    assert scales["z"] is not None  # fc2's own output is only a graph output
    compare_int8(cm, calib[:4])


def test_container_keeps_int32_outputs_and_cli_option(tmp_path, capsys):
    path, _ = classifier(tmp_path / "c.onnx", softmax=False)
    calib = np.random.default_rng(5).normal(0, 0.5, (32, 32)).astype(np.float32)
    np.save(tmp_path / "calib.npy", calib)
    cm = compile_onnx(path, "tiny", calib=calib)
    cm.to_container().save(tmp_path / "c.npub")
    back = Container.load(tmp_path / "c.npub")
    desc = back.manifest.outputs[0]
    assert desc.layout.elem == 4 and desc.scales == cm.lowered.outputs[0].scales
    raw, _ = run_container(back, [calib[:4]], cm.cfg, int8=True)
    assert raw[0].dtype == np.int32
    np.testing.assert_array_equal(raw[0], cm.run_int8(calib[:4])[0])
    manifest = json.loads(json.dumps(back.manifest.to_json()))
    assert manifest["outputs"][0]["layout"]["elem"] == 4
    # int8 output precision: the output at its activation type
    cases = (("int8", "int16", 2), ("int8", "int8", 1), ("int32", "auto", 4), ("int32", "int8", 4))
    for prec, act, elem in cases:
        out = tmp_path / f"{prec}-{act}.npub"
        assert main(["compile", str(path), "--config", "tiny", "--calib", str(tmp_path / "calib.npy"),
                     "--output-precision", prec, "--activations", act, "-o", str(out)]) == 0  # fmt: skip
        assert Container.load(out).manifest.outputs[0].layout.elem == elem, (prec, act)


def test_activation_the_quantiser_removed_keeps_its_clamp(tmp_path):
    """Gemm -> Relu as the output: onnxruntime's quantiser drops the Relu and lets the output's int8
    range (from 0) clamp instead, so that output keeps its QuantizeLinear (int8, non-negative)."""
    rng = np.random.default_rng(6)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (32, 10)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "b")]  # fmt: skip
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])
    g = helper.make_graph(nodes, "r", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.save(m, str(tmp_path / "r.onnx"))
    calib = rng.normal(0, 1, (32, 32)).astype(np.float32)
    cm = compile_onnx(tmp_path / "r.onnx", "tiny", calib=calib, activations="int8")  # (int16 keeps Relus)
    assert cm.lowered.outputs[0].scales is None and "Relu" not in [n.op_type for n in cm.qdq.graph.node]
    got = cm.run(calib[:4])[0]
    assert got.min() >= 0 and (got == 0).any()
    compare_int8(cm, calib[:4])


def test_report_names_the_quantisation_and_the_host_share(tmp_path):
    path, _ = classifier(tmp_path / "s.onnx", softmax=True)
    calib = np.random.default_rng(2).normal(0, 0.5, (32, 32)).astype(np.float32)
    report = compile_onnx(path, "tiny", calib=calib, calib_method="percentile").report()
    # one batch of 4 of the 32 samples held back for the accuracy check
    assert "quantisation: mixed activations: 5 of 5 tensors int8 (summed int8 loss " in report
    assert "(percentile calibration, 28 samples), weights per" in report
    assert "(4 held back for the accuracy check)" in report
    assert "accuracy: cosine against onnxruntime float on 4 held-back calibration samples" in report
    assert "(auto)" in report
    assert "outputs int32" in report
    assert "host: 1 operators in 1 steps, 0 MACs" in report
