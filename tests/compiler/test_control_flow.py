"""Static control flow (compiler/control.py): an If with a constant condition takes its branch, a
Loop with a constant trip count is unrolled, and the compiled model matches onnxruntime float; any
other If, Loop or Scan is a CompileError naming the node."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu.compiler import compile_onnx
from npu.compiler.accuracy import cosine
from npu.compiler.graph import CompileError
from tests.compiler.helpers import ort_outputs

RNG = np.random.default_rng(3)
W = RNG.normal(0, 0.3, (16, 16)).astype(np.float32)
B = RNG.normal(0, 0.1, (16,)).astype(np.float32)


def _body(cond_out_from_data: bool = False) -> onnx.GraphProto:
    """h' = Relu(h @ W + b); scan output h' (a recurrent cell over a static number of steps)."""
    nodes = [
        helper.make_node("MatMul", ["h_in", "W"], ["hw"], name="cell_mm"),
        helper.make_node("Add", ["hw", "B"], ["hb"], name="cell_add"),
        helper.make_node("Relu", ["hb"], ["h_out"], name="cell_relu"),
        helper.make_node("Identity", ["h_out"], ["scan"], name="cell_scan"),
    ]
    if cond_out_from_data:
        nodes += [
            helper.make_node("ReduceSum", ["h_out"], ["s"], name="cell_sum", keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["cond_out"], name="cell_more"),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"], name="cell_cond"))
    inits = [numpy_helper.from_array(np.array(0, np.float32), "zero")] if cond_out_from_data else []
    return helper.make_graph(
        nodes,
        "cell",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, 16]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, 16]),
            helper.make_tensor_value_info("scan", TensorProto.FLOAT, [1, 16]),
        ],
        inits,
    )


def _model(kind: str) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")]
    pre = helper.make_node("Gemm", ["x", "W", "B"], ["h0"], name="embed")
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])]
    if kind.startswith("loop"):
        trips = "M" if kind != "loop-dynamic" else "m_in"
        inits += [
            numpy_helper.from_array(np.array(4, np.int64), "M"),
            numpy_helper.from_array(np.array(True), "T"),
        ]
        loop = helper.make_node(
            "Loop", [trips, "T", "h0"], ["h_last", "hs"], name="rnn", body=_body(kind == "loop-early-exit")
        )
        nodes = [pre, loop, helper.make_node("Add", ["h_last", "h0"], ["y"], name="skip")]
        outs.append(helper.make_tensor_value_info("hs", TensorProto.FLOAT, [4, 1, 16]))
    else:

        def branch(name, op):
            return helper.make_graph(
                [helper.make_node(op, ["h0"], [f"{name}_y"], name=f"{name}_op")], name, [],
                [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1, 16])],
            )  # fmt: skip

        cond = "C" if kind == "if-constant" else "c_in"
        inits.append(numpy_helper.from_array(np.array(False), "C"))
        node = helper.make_node(
            "If",
            [cond],
            ["y"],
            name="gate",
            then_branch=branch("then", "Sigmoid"),
            else_branch=branch("else", "Relu"),
        )
        nodes = [pre, node]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])]
    if kind in ("loop-dynamic", "if-dynamic"):  # a trip count or condition from the data
        inits.append(numpy_helper.from_array(np.array(0, np.float32), "zero"))
        nodes[:0] = [
            helper.make_node("ReduceSum", ["x"], ["sx"], name="total", keepdims=0),
            helper.make_node("Greater", ["sx", "zero"], ["c_in"], name="positive"),
            helper.make_node("Cast", ["c_in"], ["m_in"], name="count", to=TensorProto.INT64),
        ]
    g = helper.make_graph(nodes, kind, ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("kind", ["loop", "if-constant"])
def test_static_control_flow_compiles_and_matches_onnxruntime(tmp_path, kind):
    model = _model(kind)
    path = tmp_path / f"{kind}.onnx"
    onnx.save(model, str(path))
    calib = RNG.normal(0, 1, (16, 16)).astype(np.float32)
    cm = compile_onnx(path, "default", calib=calib)
    ops = [la.op for la in cm.lowered.layers]
    assert "Loop" not in ops and "If" not in ops, ops
    x = RNG.normal(0, 1, (1, 16)).astype(np.float32)
    for got, want in zip(cm.run(x), ort_outputs(model, x), strict=True):
        assert got.shape == want.shape and cosine(got, want) >= 0.99
    if kind == "loop":
        assert ops.count("Gemm") + ops.count("MatMul") == 5  # the embedding, the body 4 times over
        assert any("unrolled 4 times" in n for n in cm.frontend)
        assert all(la.placement == "npu" for la in cm.lowered.layers if la.op in ("Gemm", "MatMul"))
    else:
        assert "Relu" in ops or "Gemm" in ops  # the else branch (the Relu may fuse into the Gemm)
        assert "Sigmoid" not in ops


@pytest.mark.parametrize(
    "kind,msg",
    [
        ("loop-dynamic", r"node 'rnn' \(Loop\): .* its trip count is not a constant"),
        ("loop-early-exit", r"node 'rnn' \(Loop\): .* its condition may end it early"),
        ("if-dynamic", r"node 'gate' \(If\): .* its condition is not a constant"),
    ],
)
def test_control_flow_that_is_not_static_is_refused_by_name(tmp_path, kind, msg):
    path = tmp_path / f"{kind}.onnx"
    onnx.save(_model(kind), str(path))
    with pytest.raises(CompileError, match=msg):
        compile_onnx(path, "default", calib=np.zeros((4, 16), np.float32))
