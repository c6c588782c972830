"""The compiler on Gemm/MatMul/Relu models against onnxruntime running the same QDQ model."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu.compiler import CompileError, compile_onnx
from tests.compiler.helpers import ort_session


def mlp_onnx(path, weights, biases, batch, relu_between=True, use_matmul=False):
    nodes, inits = [], []
    x = "x"
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        inits += [
            numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
            numpy_helper.from_array(b.astype(np.float32), f"b{i}"),
        ]
        y = f"h{i}"
        if use_matmul:
            nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"]))
            nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], [y]))
        else:
            nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [y], name=f"gemm{i}"))
        x = y
        if relu_between and i < len(weights) - 1:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
    k = weights[0].shape[0]
    n = weights[-1].shape[1]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, k])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, n])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10  # readable by onnxruntime
    onnx.save(model, str(path))
    return path


def ort_int8(compiled, x):
    sess = ort_session(compiled.qdq)
    y = sess.run(None, {sess.get_inputs()[0].name: x.astype(np.float32)})[0]
    t = compiled.lowered.outputs[0]
    return np.clip(np.rint(y / t.scale) + t.zero_point, -128, 127).astype(np.int8)


@pytest.mark.parametrize("config", ["tiny", "default", "banked"])
@pytest.mark.parametrize("shape", [(8, 16, 8), (4, 40, 24), (33, 70, 10)])
def test_gemm_relu_layers_match_onnxruntime(tmp_path, config, shape):
    batch, k, n = shape
    rng = np.random.default_rng(sum(shape))
    ws = [rng.normal(0, 1 / np.sqrt(k), (k, n)), rng.normal(0, 1 / np.sqrt(n), (n, n))]
    bs = [rng.normal(0, 0.1, n), rng.normal(0, 0.1, n)]
    path = mlp_onnx(tmp_path / "m.onnx", ws, bs, batch)
    calib = rng.normal(0, 1, (batch * 8, k)).astype(np.float32)
    cm = compile_onnx(path, config, calib=calib, output_precision="int8", activations="int8")  # int8 path
    x = rng.normal(0, 1, (batch, k)).astype(np.float32)
    got = cm.run_int8(x)[0]
    want = ort_int8(cm, x)
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.99 or (diff <= 1).mean() >= 0.99, diff.max()
    assert (diff <= 1).mean() >= 0.99


def test_digits_mlp_accuracy(tmp_path, capsys):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    xs, ys = load_digits(return_X_y=True)
    xs = (xs / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(xs, ys, test_size=0.25, random_state=0)
    clf = MLPClassifier(hidden_layer_sizes=(64,), max_iter=600, random_state=0).fit(xtr, ytr)
    batch = len(xte)
    path = mlp_onnx(tmp_path / "digits.onnx", clf.coefs_, clf.intercepts_, batch)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    float_acc = (sess.run(None, {"x": xte})[0].argmax(1) == yte).mean()
    cm = compile_onnx(path, "default", calib=np.concatenate([xtr[:batch], xtr[:batch]]))
    npu_acc = (cm.run(xte)[0].argmax(1) == yte).mean()
    print(f"digits MLP: onnxruntime float accuracy {float_acc:.4f}, NPU (model backend) {npu_acc:.4f}")
    assert abs(float_acc - npu_acc) <= 0.01


def test_clear_errors(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx file")
    with pytest.raises(CompileError, match="not a readable ONNX model"):
        compile_onnx(bad)
    with pytest.raises(CompileError, match="no such file"):
        compile_onnx(tmp_path / "missing.onnx")
    rng = np.random.default_rng(0)
    path = mlp_onnx(tmp_path / "m.onnx", [rng.normal(size=(8, 4))], [np.zeros(4)], 2)
    with pytest.raises(CompileError, match="calibration data"):
        compile_onnx(path)
    # an operator that runs nowhere (a custom domain) is named with its node
    q = [
        numpy_helper.from_array(np.array(0.1, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("FancyOp", ["xd"], ["y"], name="sm", domain="com.example"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        q,
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)]
    )
    onnx.save(m, str(tmp_path / "s.onnx"))
    with pytest.raises(CompileError, match=r"'sm' \(com.example.FancyOp\).*run neither"):
        compile_onnx(tmp_path / "s.onnx")
    # dynamic batch
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(tmp_path / "d.onnx"))
    with pytest.raises(CompileError, match="dynamic dimension"):
        compile_onnx(tmp_path / "d.onnx", calib=rng.normal(size=(4, 4)).astype(np.float32))


def test_qdq_relu_with_rescale_runs_as_vmap(tmp_path):
    """A QDQ model taken as given: Q -> DQ -> Relu -> Q (other scale) -> DQ; Relu is a VMAP."""
    rng = np.random.default_rng(3)

    def c(name, v, dt):
        return numpy_helper.from_array(np.array(v, dt), name)

    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        helper.make_node("Relu", ["xd"], ["r"], name="relu"),
        helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"]),
    ]
    inits = [
        c("sx", 0.05, np.float32),
        c("zx", 7, np.int8),
        c("sy", 0.03, np.float32),
        c("zy", -100, np.int8),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 50])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 50])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "r.onnx"))
    cm = compile_onnx(tmp_path / "r.onnx", "tiny")
    assert [la.op for la in cm.lowered.layers] == ["Relu"]
    x = rng.normal(0, 3, size=(6, 50)).astype(np.float32)
    got, want = cm.run_int8(x)[0], ort_int8(cm, x)
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.9


@pytest.mark.parametrize("config", ["tiny", "default", "banked"])
def test_qdq_add_of_two_tensors_runs_as_vadd(tmp_path, config):
    """Add of two differently quantised tensors (a residual join) as one VADD, vs onnxruntime."""
    rng = np.random.default_rng(11)

    def c(name, v, dt):
        return numpy_helper.from_array(np.array(v, dt), name)

    nodes = [
        helper.make_node("QuantizeLinear", ["a", "sa", "za"], ["aq"]),
        helper.make_node("DequantizeLinear", ["aq", "sa", "za"], ["ad"]),
        helper.make_node("QuantizeLinear", ["b", "sb", "zb"], ["bq"]),
        helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"]),
        helper.make_node("Add", ["ad", "bd"], ["s"], name="residual"),
        helper.make_node("QuantizeLinear", ["s", "sy", "zy"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"]),
    ]
    inits = [
        c("sa", 0.02, np.float32),
        c("za", -3, np.int8),
        c("sb", 0.05, np.float32),
        c("zb", 10, np.int8),
        c("sy", 0.06, np.float32),
        c("zy", 2, np.int8),
    ]
    shape = [7, 300]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, shape),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "add.onnx"))
    cm = compile_onnx(tmp_path / "add.onnx", config)
    assert [la.op for la in cm.lowered.layers] == ["Add"]
    a = rng.normal(0, 2, shape).astype(np.float32)
    bv = rng.normal(0, 4, shape).astype(np.float32)
    got = cm.run_int8(a, bv)[0]
    sess = ort_session(cm.qdq)
    y = sess.run(None, {"a": a, "b": bv})[0]
    want = np.clip(np.rint(y / 0.06) + 2, -128, 127).astype(np.int8)
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.9
