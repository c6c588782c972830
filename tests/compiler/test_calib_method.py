"""`--calib-method`: activation ranges from onnxruntime's calibrators. One outlier in the calibration
inputs sets the min/max range; the percentile range ignores it, so the ordinary inputs keep more
int8 levels (and come out closer to the float model). A method that does not exist is refused."""

import numpy as np
import onnx
import pytest

from npu.compiler import compile_onnx
from npu.compiler.errors import AccuracyError
from npu.compiler.graph import CompileError
from npu.models.builder import Net
from tests.compiler.helpers import cosine, ort_outputs


def _scale(cm, tensor: str) -> float:
    g = cm.qdq.graph
    q = next(n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    return float(onnx.numpy_helper.to_array(next(i for i in g.initializer if i.name == q.input[1])))


def test_percentile_ignores_an_outlier(tmp_path):
    net = Net("calib", (1, 64), seed=3)
    model = net.model([net.gemm(net.relu(net.gemm(net.input, 64)), 8)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    rng = np.random.default_rng(0)
    calib = rng.normal(0, 1, (2000, 64)).astype(np.float32)  # 128k values: one is below 0.001 %
    calib[7, 3] = 400.0  # one sample far outside the rest
    x = rng.normal(0, 1, (1, 64)).astype(np.float32)
    (ref,) = ort_outputs(model, x)
    # int8 activations: 255 steps over the outlier's range leave the rest a few (int16 has plenty)
    # (the accuracy guard refuses both at int8 - cosine 0.86 and 0.98 on held-back samples - so it
    # is off here, where the two are compared; it is on below)
    methods = ("minmax", "percentile")
    cms = {
        m: compile_onnx(path, calib=calib, calib_method=m, activations="int8", accuracy_check=False)
        for m in methods
    }
    s = {m: _scale(cm, net.input) for m, cm in cms.items()}
    assert s["percentile"] < s["minmax"] / 10, s
    cos = {m: cosine(cm.run(x)[0], ref) for m, cm in cms.items()}
    assert cos["percentile"] > cos["minmax"], cos
    refused = r"output 'gemm7' .* reaches cosine 0\.\d+ .* below the target 0\.99"
    with pytest.raises(AccuracyError, match=refused):
        compile_onnx(path, calib=calib, activations="int8")
    with pytest.raises(CompileError, match="calib_method must be one of minmax, percentile, entropy"):
        compile_onnx(path, calib=calib, calib_method="kl")
