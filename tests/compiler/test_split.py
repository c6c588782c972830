"""Split along channels on the NPU (compiler/ops/split.py), exact against onnxruntime's QDQ model."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.compiler.helpers import compare_int8, compile_model


def split_model(sizes, cin=6, shape=(1, 6, 6, 5)):
    """Conv (sum(sizes) channels) -> Split -> a Conv on each part -> Concat (a C2f-like block)."""
    rng = np.random.default_rng(sum(sizes))
    c = sum(sizes)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (c, cin, 3, 3)).astype(np.float32), "w0"),
             numpy_helper.from_array(np.array(sizes, np.int64), "sizes")]  # fmt: skip
    parts = [f"s{i}" for i in range(len(sizes))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("Split", ["a", "sizes"], parts, axis=1, name="split")]  # fmt: skip
    for i, s in enumerate(sizes):
        w = rng.normal(0, 0.4, (4, s, 1, 1)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i + 1}"))
        nodes.append(helper.make_node("Conv", [f"s{i}", f"w{i + 1}"], [f"c{i}"], name=f"conv{i + 1}"))
    nodes.append(helper.make_node("Concat", [f"c{i}" for i in range(len(sizes))], ["y"], axis=1, name="cat"))
    n, _, h, w = shape
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 4 * len(sizes), h, w])
    g = helper.make_graph(nodes, "split", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize(
    ("sizes", "config"), [([8, 8], "tiny"), ([5, 11, 3], "default"), ([16, 16], "banked")]
)
def test_split_on_channels_runs_on_the_npu(tmp_path, sizes, config):
    m = split_model(sizes)
    calib = np.random.default_rng(1).normal(0, 1, (8, 6, 6, 5)).astype(np.float32)
    cm = compile_model(tmp_path, m, config, calib)
    la = next(la for la in cm.lowered.layers if la.op == "Split")
    assert la.placement == "npu", la
    compare_int8(cm, np.random.default_rng(2).normal(0, 1, (1, 6, 6, 5)).astype(np.float32))
