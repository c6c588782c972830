"""Mixed precision (compiler/precision.py): any int8/int16 mix runs on the golden model as
onnxruntime runs its QDQ model; `auto` takes int8 where the calibration outputs vouch for it and
keeps int16 where they cannot (saturated outputs) or where the mix fails the accuracy check."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from npu.compiler import compile_onnx, precision
from npu.compiler.cleanup import cleanup
from npu.compiler.quantize import calibrated_ranges_of, quantize_float_model
from npu.models import zoo
from npu.models.builder import Net
from npu.sim.golden.runner import run_container
from tests.compiler.helpers import cosine, ort_outputs


def _q_types(model: onnx.ModelProto) -> set[int]:
    """The integer types the QuantizeLinear nodes of `model` quantise activations to."""
    types = {i.name: i.data_type for i in model.graph.initializer}
    return {types[n.input[2]] for n in model.graph.node if n.op_type == "QuantizeLinear" and len(n.input) > 2}


@pytest.mark.parametrize("name", ["resnet_small", "inception_small", "multipath", "perception", "longconv"])
def test_any_mix_runs_as_onnxruntime_runs_it(tmp_path, name):
    """Every other group of activations (precision.groups) int16, the rest int8: convolutions and
    GEMMs convert between the types, every operator stays on the NPU, and the outputs keep the int8
    rule against onnxruntime's QDQ model of the same mix: within one int8 step (of the output's
    range) on 99 % of the elements. (An int16 output is not held to 4 of its own steps as in
    test_int16.py: an int8 tensor upstream rounds once in a while one int8 step away from
    onnxruntime's float rounding, which is 256 int16 steps before it is scaled down.)"""
    z = zoo.ZOO[name]()
    model = cleanup(z.model)
    ranges = calibrated_ranges_of(model, z.calib, "minmax", name)
    units = precision.groups(model, sorted(ranges))
    int16 = {t for u in units[::2] for t in u}
    qdq = quantize_float_model(model, z.calib, name, activations="mixed", int16=int16, ranges=ranges)
    assert _q_types(qdq) == {TensorProto.INT8, TensorProto.INT16}
    onnx.save(qdq, str(tmp_path / "mix.onnx"))
    cm = compile_onnx(tmp_path / "mix.onnx", "default")
    both = onnx.load(tmp_path / "mix.onnx")
    host = [(la.node, la.reason) for la in cm.lowered.layers if la.placement == "host"]
    assert all(n.op_type == "Softmax" for n in both.graph.node if n.name in dict(host)), host
    batch = z.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value or 1
    x = z.test[:batch]
    for g, w, t in zip(cm.run(x), ort_outputs(cm.qdq, x), cm.lowered.outputs, strict=True):
        step = t.scale * (256 if t.layout.elem == 2 else 1)
        assert (np.abs(g - w) <= step * 1.0001).mean() >= 0.99, (t.name, np.abs(g - w).max() / step)


def test_a_mix_of_all_int16_is_the_int16_quantisation():
    z = zoo.resnet_small()
    model = cleanup(z.model)
    ranges = calibrated_ranges_of(model, z.calib, "minmax", "r")
    mixed = quantize_float_model(model, z.calib, "r", activations="mixed", int16=set(ranges), ranges=ranges)
    int16 = quantize_float_model(model, z.calib, "r", activations="int16")
    assert [n.op_type for n in mixed.graph.node] == [n.op_type for n in int16.graph.node]
    want = {i.name: numpy_helper.to_array(i) for i in int16.graph.initializer}
    for i in mixed.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(i), want[i.name], err_msg=i.name)


def test_auto_takes_int8_where_the_outputs_vouch_for_it(tmp_path):
    """resnet_small's logits respond to int8 noise: the default compiles part of its MACs at int8,
    in fewer golden-model cycles than int16 everywhere, and passes the accuracy check."""
    z = zoo.resnet_small()
    path = tmp_path / "r.onnx"
    onnx.save(z.model, str(path))
    auto = compile_onnx(path, "default", calib=z.calib)
    int16 = compile_onnx(path, "default", calib=z.calib, activations="int16")
    assert auto.quantisation.startswith("mixed activations: "), auto.quantisation
    assert auto.placement.int8_mac_share > 0.5, auto.quantisation
    assert int16.placement.int8_mac_share == 0
    assert auto.accuracy.worst >= 0.99
    assert "mixed activations: " in auto.report()
    cycles = [run_container(cm.to_container(), [z.test[:1]], cm.cfg)[1]["CYCLES"] for cm in (auto, int16)]
    assert cycles[0] < cycles[1], cycles
    for x in z.test[:4]:
        assert cosine(auto.run(x[None])[0], ort_outputs(z.model, x[None])[0]) >= 0.99


def _sure_classifier(path):
    """A classifier whose Softmax is sure of every input (logits scaled up 40 times): its outputs
    stay at 0 and 1 whatever noise the activations carry."""
    net = Net("sure", (1, 8, 12, 12), seed=5)
    h = net.flatten(net.gap(net.conv(net.conv(net.input, 16, 3), 32, 3)))
    logits = net.gemm(h, 4)
    scaled = net.node("Mul", [logits, net.const(np.float32(40.0), "t")], net.shapes[logits])
    y = net.softmax(scaled)
    onnx.save(net.model([y]), str(path))


def test_auto_keeps_int16_where_the_calibration_outputs_cannot_see_int8_noise(tmp_path):
    _sure_classifier(tmp_path / "s.onnx")
    calib = np.random.default_rng(0).normal(size=(16, 8, 12, 12)).astype(np.float32)
    cm = compile_onnx(tmp_path / "s.onnx", "default", calib=calib)
    assert "do not respond to int8 noise" in cm.quantisation, cm.quantisation
    assert cm.placement.int8_mac_share == 0
    assert all(t.layout.elem == 2 for t in cm.lowered.inputs)


def test_auto_falls_back_to_int16_when_the_mix_fails_the_check(tmp_path, monkeypatch):
    """A mix the golden-model check refuses is not repaired operator by operator: auto compiles
    int16 everywhere instead, and the report says why. The mix here is every tensor int8 (a
    selection that trusted its samples too much) on a model whose calibration saw one input 60
    times the others: int8 steps over that range lose the typical inputs, int16 steps do not."""
    net = Net("tail", (1, 64), seed=2)
    y = net.gemm(net.relu(net.gemm(net.input, 64)), 10)
    onnx.save(net.model([y]), str(tmp_path / "t.onnx"))
    calib = np.random.default_rng(3).normal(size=(32, 64)).astype(np.float32)
    calib[0] *= 60
    real_choose = precision.choose

    def everything_int8(*args, **kw):
        c = real_choose(*args, **kw)
        return precision.Choice(set(), c.tensors, c.cosine, c.goal, c.steps, c.spent, c.budget, c.response)

    monkeypatch.setattr(precision, "choose", everything_int8)
    cm = compile_onnx(tmp_path / "t.onnx", "default", calib=calib)
    assert "(auto: the int8/int16 mix failed the accuracy check: " in cm.quantisation, cm.quantisation
    assert cm.quantisation.startswith("int16 activations")
    assert cm.placement.int8_mac_share == 0 and cm.accuracy.worst >= 0.99
