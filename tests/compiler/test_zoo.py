"""The model zoo through the compiler: trained digits models keep their accuracy, branchy and
residual networks match onnxruntime's QDQ model, ImageNet-class topologies compile quickly and stay
close to onnxruntime's float outputs."""

import time

import numpy as np
import pytest

from npu.models import zoo
from npu.models.__main__ import main as zoo_main
from tests.compiler.conftest import IMAGENET_GROUP
from tests.compiler.helpers import compare_int8, compile_model, cosine, ort_outputs


def test_digits_cnn_accuracy(tmp_path, capsys):
    z = zoo.digits_cnn(batch=len(zoo.digits_split()[1]))
    float_acc = (ort_outputs(z.model, z.test)[0].argmax(1) == z.labels).mean()
    calib = np.concatenate([z.calib] * 2)[: len(z.test)]
    cm = compile_model(tmp_path, z.model, "default", calib)
    npu_acc = (cm.run(z.test)[0].argmax(1) == z.labels).mean()
    with capsys.disabled():
        print(f"\ndigits CNN: onnxruntime float accuracy {float_acc:.4f}, NPU (model backend) {npu_acc:.4f}")
    assert float_acc > 0.9
    assert abs(float_acc - npu_acc) <= 0.01


@pytest.mark.parametrize("name", ["resnet_small", "inception_small", "perception", "planning", "fc_deep"])
def test_zoo_models_match_onnxruntime(tmp_path, name):
    z = zoo.ZOO[name]()
    cm = compile_model(tmp_path, z.model, "default", z.calib)
    batch = z.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value
    compare_int8(cm, z.test[:batch])


@IMAGENET_GROUP
@pytest.mark.parametrize("name", list(zoo.IMAGENET))
def test_imagenet_class_topologies(imagenet_int8, name, capsys):
    t0 = time.perf_counter()
    cm, z = imagenet_int8(name)  # int8 activations, as compile_model's
    compile_s = time.perf_counter() - t0  # 0 when test_arena.py's test compiled it first
    got = cm.run(z.test[:1])
    want = ort_outputs(z.model, z.test[:1])  # the float model
    cos = [cosine(g, w) for g, w in zip(got, want, strict=True)]
    ops = {la.op for la in cm.lowered.layers}
    with capsys.disabled():
        print(
            f"\n{name}: compile {compile_s:.1f} s, cosine vs float onnxruntime (probabilities, logits) {cos}"
        )
    assert min(cos) >= 0.99
    assert cm.lowered.layers[-1].placement == "host" and cm.lowered.layers[-1].op == "Softmax"
    assert "Concat" in ops or "Add" in ops


def test_zoo_script_is_reproducible(tmp_path):
    assert zoo_main(["-o", str(tmp_path / "a"), "planning", "resnet_small"]) == 0
    assert zoo_main(["-o", str(tmp_path / "b"), "planning", "resnet_small"]) == 0
    for f in ("planning.onnx", "resnet_small.onnx", "resnet_small.calib.npy"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    with pytest.raises(SystemExit):
        zoo_main(["-o", str(tmp_path), "nosuchmodel"])
