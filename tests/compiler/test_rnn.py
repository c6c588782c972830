"""LSTM and GRU unrolled over their sequences (compiler/rnn.py): every step on the NPU, the outputs
against onnxruntime's float model and, at int8, its QDQ model within one step."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.compiler.helpers import compare_int8, compile_model, cosine, ort_outputs

T, B, I, H = 10, 1, 16, 24


def recurrent(kind: str, direction: str, initial: bool = False, seed: int = 0, **attrs) -> onnx.ModelProto:
    """x (T, B, I) -> LSTM/GRU -> Y (T, dirs, B, H) -> a linear layer per step; Y_h an output too.
    `initial`: initial_h (and initial_c) given as a constant."""
    rng = np.random.default_rng(seed)
    gates, dirs = (4 if kind == "LSTM" else 3), (2 if direction == "bidirectional" else 1)
    arrays = {
        "W": rng.normal(0, I**-0.5, (dirs, gates * H, I)),
        "R": rng.normal(0, H**-0.5, (dirs, gates * H, H)),
        "B": rng.normal(0, 0.1, (dirs, 2 * gates * H)),
        "fc": rng.normal(0, 0.3, (dirs * H, 10)),
    }
    ins = ["x", "W", "R", "B"]
    states = []  # the initial state: graph inputs (a streaming model carries it from call to call)
    if initial:
        ins += ["", "h0"] + (["c0"] if kind == "LSTM" else [])
        states = [helper.make_tensor_value_info(s, TensorProto.FLOAT, [dirs, B, H]) for s in ins[5:]]
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in arrays.items()]
    inits.append(numpy_helper.from_array(np.array([T, dirs * H], np.int64), "shape"))
    nodes = [
        helper.make_node(kind, ins, ["Y", "Yh"], hidden_size=H, direction=direction, name="rnn", **attrs),
        helper.make_node("Transpose", ["Y"], ["Yt"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["Yt", "shape"], ["Yr"]),
        helper.make_node("MatMul", ["Yr", "fc"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "rnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, B, I]), *states],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, 10]),
         helper.make_tensor_value_info("Yh", TensorProto.FLOAT, [dirs, B, H])], inits,
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _x(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (n * T, B, I)).astype(np.float32)


def _inputs(model: onnx.ModelProto, n: int, seed: int) -> list[np.ndarray]:
    """x, then the initial states the model takes (n samples each, stacked on the first axis)."""
    rng = np.random.default_rng(seed + 100)
    states = [rng.normal(0, 0.5, (n * i.type.tensor_type.shape.dim[0].dim_value, B, H)).astype(np.float32)
              for i in model.graph.input[1:]]  # fmt: skip
    return [_x(n, seed), *states]


def _calib(model: onnx.ModelProto, n: int, seed: int):
    xs = _inputs(model, n, seed)
    return xs[0] if len(xs) == 1 else {i.name: x for i, x in zip(model.graph.input, xs, strict=True)}


@pytest.mark.parametrize(
    "kind,direction,initial,attrs",
    [
        ("LSTM", "forward", False, {}),
        ("LSTM", "bidirectional", True, {}),
        ("GRU", "forward", True, {"linear_before_reset": 1}),
        ("GRU", "reverse", False, {}),
    ],
)
def test_a_recurrent_layer_runs_step_by_step_on_the_npu(tmp_path, kind, direction, initial, attrs):
    model = recurrent(kind, direction, initial, **attrs)
    cm = compile_model(tmp_path, model, "default", _calib(model, 16, 1), kind)
    assert "recurrent layers unrolled" in cm.report()
    layers = cm.lowered.layers
    assert not any(la.op in ("LSTM", "GRU") for la in layers)
    # every MAC of the steps on the NPU (a bidirectional Y_h's final Concat stays float: an output)
    assert cm.placement.macs_host == 0 < cm.placement.macs_npu, cm.placement
    # on the host only data movement: a graph input read only by a Gather stays float (the initial
    # states), and a bidirectional Y_h's final Concat stays float (a graph output)
    host = [(la.op, la.reason) for la in layers if la.placement == "host"]
    assert all(op in ("Concat", "Gather", "Reshape") for op, _ in host), host
    xs = _inputs(model, 1, 2)
    compare_int8(cm, *xs)
    for got, want in zip(cm.run(*xs), ort_outputs(model, *xs), strict=True):
        assert cosine(got, want) > 0.99


def test_a_recurrent_layer_with_the_default_options_keeps_its_accuracy(tmp_path):
    model = recurrent("LSTM", "forward", True, seed=3)
    cm = compile_model(tmp_path, model, "default", _calib(model, 16, 4), "lstm", activations="auto")
    assert cm.placement.macs_host == 0
    for s in range(3):
        xs = _inputs(model, 1, 10 + s)
        for got, want in zip(cm.run(*xs), ort_outputs(model, *xs), strict=True):
            assert cosine(got, want) >= 0.99


def test_a_recurrent_layer_that_is_not_unrolled_stays_one_host_operator(tmp_path):
    model = recurrent("LSTM", "forward", clip=5.0)
    cm = compile_model(tmp_path, model, "default", _x(8, 5), "lstm")
    assert "LSTM rnn: kept as one host operator (a cell clip)" in cm.report()
    assert [la.op for la in cm.lowered.layers if la.placement == "host"][:1] == ["LSTM"]
    x = _x(1, 6)
    for got, want in zip(cm.run(x), ort_outputs(model, x), strict=True):
        assert cosine(got, want) > 0.99


@pytest.mark.parametrize(
    "change,why",
    [
        ({"attrs": {"input_forget": 1}}, "input_forget"),
        ({"attrs": {"layout": 1}}, "layout 1"),
        ({"attrs": {"activations": [b"Sigmoid", b"Relu", b"Tanh"]}}, "activations"),
        ({"consts": {"P": np.ones((1, 3 * H), np.float32)}}, "peephole"),
        ({"consts": {"h0": np.ones((1, B, H), np.float32)}}, "constant initial state"),
        ({"drop": "R"}, "not constants"),
        ({"shape": (33, B, I)}, "more than the 32 unrolled"),
        ({"shape": None}, "static"),
    ],
)
def test_what_keeps_a_recurrent_layer_on_the_host_is_named(change, why):
    from npu.compiler.rnn import why_not_unrolled

    m = recurrent("LSTM", "forward", **change.get("attrs", {}))
    n = next(x for x in m.graph.node if x.op_type == "LSTM")
    consts = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    consts.update(change.get("consts", {}))
    if "P" in change.get("consts", {}):
        n.input.extend(["", "", "", "P"])
    if "h0" in change.get("consts", {}):
        n.input.extend(["", "h0"])
    consts.pop(change.get("drop", ""), None)
    assert why in why_not_unrolled(n, consts, change.get("shape", (T, B, I)))
    assert (
        why_not_unrolled(
            recurrent("LSTM", "forward").graph.node[0], consts | {"R": consts.get("W")}, (T, B, I)
        )
        is None
    )
