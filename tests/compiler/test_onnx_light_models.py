"""The ImageNet topologies the `onnx` package ships as backend test data (`light_*.onnx`: Caffe2
exports at IR 3 and opset 9, every initializer listed as a graph input, residual connections as
two-input Sum, batch normalisation after each convolution), compiled as a user would: default
options, random calibration. Their weights are constants, so the outputs say little about
accuracy; what is tested is that such graphs compile with every multiply-accumulate and every
operator but the final Softmax on the NPU and run to onnxruntime's result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from npu.compiler import compile_onnx
from tests.compiler.helpers import cosine, ort_outputs

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.mark.parametrize("name", ["resnet50", "shufflenet"])
def test_light_model_compiles_onto_the_npu(name):
    path = LIGHT / f"light_{name}.onnx"
    m = onnx.load(str(path))
    inits = {i.name for i in m.graph.initializer}
    assert m.ir_version == 3 and sum(i.name in inits for i in m.graph.input) > 100  # what is tested
    rng = np.random.default_rng(0)
    cm = compile_onnx(path, "default", calib=rng.normal(0, 1, (2, 3, 224, 224)).astype(np.float32))
    assert [t.name for t in cm.manifest.inputs] == [i.name for i in m.graph.input if i.name not in inits]
    host = [(la.op, la.reason) for la in cm.lowered.layers if la.placement == "host"]
    allowed = {"Softmax"} | ({"AveragePool"} if name == "shufflenet" else set())  # excludes padding
    assert {op for op, _ in host} <= allowed, host
    assert cm.placement.mac_share == 1.0
    x = rng.normal(0, 1, (1, 3, 224, 224)).astype(np.float32)
    for got, want in zip(cm.run(x), ort_outputs(m, x), strict=True):
        assert got.shape == want.shape and cosine(got, want) >= 0.99
