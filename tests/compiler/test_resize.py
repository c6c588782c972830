"""Resize on the NPU (compiler/ops/resize.py): nearest-neighbour upsampling by integer factors as a
DMA program, exact against onnxruntime's QDQ model; anything else stays on the host with a reason."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.compiler.helpers import compare_int8, compile_model


def upsample_model(scales, mode="nearest", ctm="asymmetric", nearest_mode="floor", shape=(1, 6, 5, 7)):
    """Conv -> Resize -> Conv (the Resize between two quantised operators)."""
    rng = np.random.default_rng(4)
    c = shape[1]
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.4, (8, c, 3, 3)).astype(np.float32), "w0"),
        numpy_helper.from_array(rng.normal(0, 0.3, (4, 8, 1, 1)).astype(np.float32), "w1"),
        numpy_helper.from_array(np.array(scales, np.float32), "scales"),
    ]
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if mode == "nearest":
        attrs["nearest_mode"] = nearest_mode
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Resize", ["a", "", "scales"], ["r"], name="resize", **attrs),
        helper.make_node("Conv", ["r", "w1"], ["y"], name="conv1"),
    ]
    n, _, h, w = shape
    out = [n, 4, int(h * scales[2]), int(w * scales[3])]
    g = helper.make_graph(nodes, "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize(
    ("scales", "ctm", "nearest_mode", "config"),
    [
        ([1, 1, 2, 2], "asymmetric", "floor", "tiny"),
        ([1, 1, 2, 2], "half_pixel", "round_prefer_floor", "default"),
        ([1, 1, 3, 1], "asymmetric", "floor", "tiny"),
        ([1, 1, 2, 4], "asymmetric", "floor", "banked"),
    ],
)
def test_nearest_upsampling_runs_on_the_npu(tmp_path, scales, ctm, nearest_mode, config):
    m = upsample_model(scales, ctm=ctm, nearest_mode=nearest_mode)
    calib = np.random.default_rng(1).normal(0, 1, (8, 6, 5, 7)).astype(np.float32)
    cm = compile_model(tmp_path, m, config, calib)
    la = next(la for la in cm.lowered.layers if la.op == "Resize")
    assert la.placement == "npu", la
    compare_int8(cm, np.random.default_rng(2).normal(0, 1, (1, 6, 5, 7)).astype(np.float32))


@pytest.mark.parametrize(
    ("scales", "mode", "ctm", "reason"),
    [
        ([1, 1, 2, 2], "linear", "half_pixel", "bilinear"),
        ([1, 1, 1.5, 1.5], "nearest", "asymmetric", "not integer factors"),
    ],
)
def test_other_resizes_go_to_the_host_with_a_reason(tmp_path, scales, mode, ctm, reason):
    shape = (1, 6, 4, 6)
    m = upsample_model(scales, mode=mode, ctm=ctm, shape=shape)
    calib = np.random.default_rng(1).normal(0, 1, (8, *shape[1:])).astype(np.float32)
    cm = compile_model(tmp_path, m, "tiny", calib)
    la = next(la for la in cm.lowered.layers if la.op == "Resize")
    assert la.placement == "host" and reason in la.reason, la
    compare_int8(cm, calib[:1])
