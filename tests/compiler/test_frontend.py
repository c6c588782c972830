"""The front end on models as toolchains export them: old opsets, initializers listed as inputs
(IR 3), several graph inputs, dynamic dimensions, shape
arithmetic, auto_pad, n-ary Sum, several QuantizeLinear per tensor, channels-last inputs, integer
inputs. Each model is compiled, run on the golden model and compared with onnxruntime."""

from __future__ import annotations

import re
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu.cli import main
from npu.compiler import CompileError, compile_onnx
from npu.compiler.fold import fold_constants
from npu.compiler.frontend import OpsetWarning
from npu.container import Container, HostIO, HostStep
from npu.executor import HostStepError, HostSteps
from npu.sim.golden.runner import RunError, run_container
from tests.compiler.helpers import compare_int8, cosine, ort_outputs, unfused_layers

RNG = np.random.default_rng(0)


def const(name: str, value, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def weights(name: str, shape, scale: float = 0.3) -> onnx.TensorProto:
    # seeded by a stable hash of the name: str hashes change per process (PYTHONHASHSEED), which made
    # the weights, and whether a model met its cosine bound, differ from run to run
    return const(name, np.random.default_rng(zlib.crc32(name.encode()) % 1000).normal(0, scale, shape))


def model(nodes, inputs, outputs, inits, opset: int = 17, ir: int = 8) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir
    return m


def tensor(name: str, shape, elem=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def compile_saved(tmp_path, m: onnx.ModelProto, calib=None, name="m", **kw):
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, str(path))
    return compile_onnx(path, calib=calib, **kw)


def check_float(cm, m: onnx.ModelProto, x: np.ndarray, min_cos: float = 0.99) -> list[np.ndarray]:
    """The compiled model on the golden model against onnxruntime on the float model it came from."""
    got = cm.run(x)
    want = ort_outputs(m, x)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape, (g.shape, w.shape)
        assert cosine(g, w) >= min_cos, cosine(g, w)
    return got


def normal(shape, seed=1):
    return np.random.default_rng(seed).normal(0, 1, shape).astype(np.float32)


# ---- opsets ----------------------------------------------------------------------------------------


def small_cnn(opset: int, shape=(1, 3, 8, 8)) -> onnx.ModelProto:
    """Conv -> Relu -> MaxPool -> Flatten -> Gemm, valid at opsets 7 and newer."""
    n, c, h, w = shape
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    inits = [
        weights("cw", (8, c, 3, 3)),
        weights("cb", (8,), 0.1),
        weights("fw", (5, 8 * h * w // 4), 0.1),
        weights("fb", (5,), 0.1),
    ]
    return model(nodes, [tensor("x", list(shape))], [tensor("y", [n, 5])], inits, opset=opset, ir=4)


@pytest.mark.parametrize("opset", [7, 9, 11, 12])
def test_old_opsets_are_converted_and_reported(tmp_path, opset):
    m = small_cnn(opset)
    with pytest.warns(OpsetWarning, match=f"opset {opset} converted to opset 13"):
        cm = compile_saved(tmp_path, m, normal((16, 3, 8, 8)))
    assert f"front end: opset {opset} converted to opset 13" in cm.report()
    assert [la.placement for la in cm.lowered.layers].count("npu") == 3  # Conv, MaxPool, Gemm
    x = normal((1, 3, 8, 8), seed=5)
    check_float(cm, m, x)
    compare_int8(cm, x)


def test_initializers_listed_as_inputs_are_constants(tmp_path):
    """IR 3 (the ONNX model zoo's older models) lists every initializer as a graph input; batch
    normalisation folded into the convolution must not leave its parameters behind as inputs."""
    bn = [weights("bn_s", (8,), 0.2), weights("bn_b", (8,), 0.1), weights("bn_m", (8,), 0.1)]
    bn.append(const("bn_v", np.linspace(0.5, 1.5, 8)))
    m = small_cnn(9)
    g = m.graph
    conv = g.node[0]
    conv.output[0] = "c0"
    g.node.insert(1, helper.make_node("BatchNormalization", ["c0", "bn_s", "bn_b", "bn_m", "bn_v"], ["c"]))
    g.initializer.extend(bn)
    g.input.extend(tensor(i.name, list(i.dims)) for i in g.initializer)
    m.ir_version = 3
    onnx.checker.check_model(m)
    with pytest.warns(OpsetWarning):
        cm = compile_saved(tmp_path, m, normal((16, 3, 8, 8)))
    assert [t.name for t in cm.manifest.inputs] == ["x"]
    assert "front end: 8 initializers listed as graph inputs taken as constants" in cm.report()
    assert all(la.placement != "host" for la in cm.lowered.layers)
    x = normal((1, 3, 8, 8), seed=6)
    check_float(cm, m, x)
    compare_int8(cm, x)


def test_opset_that_cannot_be_converted_names_file_and_opset(tmp_path):
    """GRU has no adapter from opset 6: the error names the file, the opset and the reason."""
    nodes = [helper.make_node("GRU", ["x", "w", "r"], ["y"], hidden_size=2)]
    inits = [const("w", np.zeros((1, 6, 8))), const("r", np.zeros((1, 6, 2)))]
    m = model(nodes, [tensor("x", [1, 1, 8])], [tensor("y", [1, 1, 1, 2])], inits, opset=6, ir=4)
    with pytest.raises(CompileError, match=r"old\.onnx: opset 6 cannot be converted.*GRU"):
        compile_saved(tmp_path, m, normal((4, 1, 8)), name="old")


# ---- input shapes and folding ----------------------------------------------------------------------


def dynamic_flatten_model() -> onnx.ModelProto:
    """A PyTorch-style export: dynamic batch, height and width; the Reshape before the Linear
    computes (N, -1) by shape arithmetic through floats (Shape -> Cast -> Slice -> Cast -> Concat)
    and the Linear's bias is scaled by ones of a shape taken from the product (Gather/Unsqueeze ->
    ConstantOfShape)."""
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
        helper.make_node("Slice", ["sf", "zero", "one"], ["nf"]),
        helper.make_node("Cast", ["nf"], ["n"], to=TensorProto.INT64),
        helper.make_node("Concat", ["n", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["r", "target"], ["flat"], name="flatten_reshape"),
        helper.make_node("MatMul", ["flat", "fw"], ["mm"]),
        helper.make_node("Shape", ["mm"], ["s2"]),
        helper.make_node("Gather", ["s2", "one_scalar"], ["k"], axis=0),
        helper.make_node("Unsqueeze", ["k", "zero"], ["bshape"]),
        helper.make_node("ConstantOfShape", ["bshape"], ["ones"], value=const("v", [1.0])),
        helper.make_node("Mul", ["ones", "fb"], ["bias"]),
        helper.make_node("Add", ["mm", "bias"], ["y"]),
    ]
    inits = [
        weights("cw", (6, 4, 3, 3)),
        weights("cb", (6,), 0.1),
        weights("fw", (6 * 5 * 5, 5), 0.1),
        weights("fb", (5,), 0.1),
        const("zero", [0], np.int64),
        const("one", [1], np.int64),
        const("minus1", [-1], np.int64),
        const("one_scalar", 1, np.int64),
    ]
    return model(nodes, [tensor("x", ["N", 4, "H", "W"])], [tensor("y", ["N", "K"])], inits)


def test_input_shape_fixes_dynamic_dimensions_and_shape_arithmetic_folds(tmp_path):
    m = dynamic_flatten_model()
    cm = compile_saved(tmp_path, m, normal((8, 4, 5, 5)), input_shapes={"x": (2, 4, 5, 5)})
    layers = unfused_layers(cm)
    # the whole shape computation folded: Conv on the NPU, the Reshape a view, the Linear a Gemm
    assert [op for op, _ in layers] == ["Conv", "Reshape", "Gemm"], layers
    assert layers[1][1] == "view"
    assert cm.lowered.outputs[0].shape == [2, 5]  # the output's ['N', 'K'] was refreshed
    x = normal((2, 4, 5, 5), seed=3)
    check_float(cm, m, x)
    compare_int8(cm, x)


def test_dynamic_input_error_names_the_option_and_the_input(tmp_path):
    with pytest.raises(CompileError, match=r"graph input 'x'.*--input-shape x=Nx4xHxW, N, H, W as numbers"):
        compile_saved(tmp_path, dynamic_flatten_model(), normal((8, 4, 5, 5)))
    # an exporter's -1 and 0 are dynamic dimensions too
    m = small_cnn(17)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 0
    with pytest.raises(
        CompileError,
        match=r"'x' has a dynamic dimension \(shape \[0, 3, 8, 8\].*--input-shape x=D0x3x8x8, D0 as",
    ):
        compile_saved(tmp_path, m, normal((8, 3, 8, 8)))
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 0
    cm = compile_saved(tmp_path, m, normal((8, 3, 8, 8)), input_shapes={"x": [1, 3, 8, 8]})
    assert cm.lowered.inputs[0].shape == [1, 3, 8, 8] and cm.lowered.outputs[0].shape == [1, 5]


@pytest.mark.parametrize(
    "shapes,msg",
    [
        ({"image": (1, 4, 5, 5)}, r"'image', which is not a graph input \(the inputs are 'x'\)"),
        ({"x": (1, 4, 5)}, r"input 'x' has rank 4 .*\[1, 4, 5\], has rank 3"),
        ({"x": (1, 3, 5, 5)}, r"input 'x' has the static dimension 4 at axis 1"),
        ({"x": (1, 4, 0, 5)}, r"\[1, 4, 0, 5\] for 'x': dimensions must be >= 1"),
    ],
)
def test_input_shape_errors_name_the_input(tmp_path, shapes, msg):
    with pytest.raises(CompileError, match=msg):
        compile_saved(tmp_path, dynamic_flatten_model(), normal((8, 4, 5, 5)), input_shapes=shapes)


def test_compile_command_takes_input_shapes(tmp_path, capsys):
    onnx.save(dynamic_flatten_model(), str(tmp_path / "d.onnx"))
    np.save(tmp_path / "c.npy", normal((8, 4, 5, 5)))
    base = ["compile", str(tmp_path / "d.onnx"), "--calib", str(tmp_path / "c.npy")]
    assert main([*base, "-o", str(tmp_path / "d.npub"), "--input-shape", "x=2x4x5x5"]) == 0
    assert Container.load(tmp_path / "d.npub").manifest.inputs[0].shape == [2, 4, 5, 5]
    capsys.readouterr()
    assert main(base) == 2
    assert "--input-shape x=Nx4xHxW" in capsys.readouterr().err
    assert main([*base, "--input-shape", "x=2x4x5x5", "--input-shape", "x=1x4x5x5"]) == 2
    assert "--input-shape x is given twice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--input-shape", "x=2by4"])
    assert "'x=2by4' is not NAME=D1xD2x..." in capsys.readouterr().err


def test_folding_reaches_a_fixpoint_through_reshapes():
    """The second target depends on the shape of the first Reshape's output, known only after the
    first target has folded (a second round); Range, Size and ConstantOfShape fold on the way."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ReduceProd", ["s"], ["count"], keepdims=1),
        helper.make_node("Reshape", ["x", "count"], ["flat"]),  # shape (96,)
        helper.make_node("Shape", ["flat"], ["fs"]),
        helper.make_node("Div", ["fs", "eight"], ["rows"]),
        helper.make_node("Concat", ["rows", "eight"], ["target2"], axis=0),
        helper.make_node("Reshape", ["flat", "target2"], ["m"]),  # (12, 8)
        helper.make_node("Size", ["m"], ["size"]),
        helper.make_node("Range", ["zero", "size", "twelve"], ["idx"]),  # 8 values
        helper.make_node("Shape", ["idx"], ["idx_shape"]),
        helper.make_node("ConstantOfShape", ["idx_shape"], ["ones"], value=const("v", [0.5])),
        helper.make_node("Mul", ["m", "ones"], ["y"]),
    ]
    inits = [const("eight", [8], np.int64), const("zero", 0, np.int64), const("twelve", 12, np.int64)]
    m = model(nodes, [tensor("x", [2, 3, 4, 4])], [tensor("y", ["a", "b"])], inits)
    f = fold_constants(m)
    assert [n.op_type for n in f.graph.node] == ["Reshape", "Reshape", "Mul"]
    assert all(n.input[1] in {t.name for t in f.graph.initializer} for n in f.graph.node)
    out = f.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in out] == [12, 8]
    x = normal((2, 3, 4, 4))
    assert np.allclose(ort_outputs(m, x)[0], ort_outputs(f, x)[0])


def test_reshape_to_a_data_dependent_shape_is_named(tmp_path):
    nodes = [
        helper.make_node("Slice", ["x", "zero", "two", "one"], ["head"]),
        helper.make_node("Abs", ["head"], ["a"]),
        helper.make_node("Cast", ["a"], ["target"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="data_reshape"),
    ]
    inits = [const("zero", [0], np.int64), const("two", [2], np.int64), const("one", [1], np.int64)]
    m = model(nodes, [tensor("x", [6])], [tensor("y", ["a", "b"])], inits)
    with pytest.raises(
        CompileError, match=r"node data_reshape \(Reshape\): the target shape 'target' is computed"
    ):
        compile_saved(tmp_path, m, normal((4, 6)))


def test_host_step_failing_at_run_time_names_its_node():
    g = helper.make_graph(
        [helper.make_node("Reshape", ["a", "t"], ["b"], name="bad_reshape")],
        "h",
        [tensor("a", [5])],
        [tensor("b", None)],
        [const("t", [2, 3], np.int64)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    step = HostStep("host0", [HostIO("a", None)], [], ["bad_reshape (Reshape)"])
    host = HostSteps({"host0": m.SerializeToString()}, [step])
    with pytest.raises(HostStepError, match=r"host step host0 \(Reshape 'bad_reshape'\) failed: ValueError"):
        host.run(None, step, {"a": np.zeros(5, np.float32)})


# ---- operators -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_auto_pad_on_conv_and_pooling(tmp_path, mode):
    """Even sizes with stride 2 and odd kernels: SAME pads differ before and after."""
    nodes = [
        helper.make_node(
            "Conv", ["x", "cw", "cb"], ["c"], auto_pad=mode, strides=[2, 2], kernel_shape=[3, 3]
        ),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], auto_pad=mode, kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node(
            "AveragePool", ["p"], ["y"], auto_pad=mode, kernel_shape=[2, 2], count_include_pad=1
        ),
    ]
    inits = [weights("cw", (8, 4, 3, 3)), weights("cb", (8,), 0.1)]
    m = model(nodes, [tensor("x", [1, 4, 16, 14])], [tensor("y", [1, 8, "h", "w"])], inits)
    cm = compile_saved(tmp_path, m, normal((16, 4, 16, 14)))
    assert unfused_layers(cm) == [
        ("Conv", "npu"), ("MaxPool", "npu"), ("AveragePool", "npu"),
    ]  # fmt: skip
    assert "auto_pad made explicit pads on 3 nodes" in cm.report()
    x = normal((1, 4, 16, 14), seed=2)
    check_float(cm, m, x)
    compare_int8(cm, x)


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_sum_of_any_number_of_inputs(tmp_path, count):
    names = [f"c{i}" for i in range(count)]
    nodes = [helper.make_node("Conv", ["x", f"w{i}"], [c], pads=[1, 1, 1, 1]) for i, c in enumerate(names)]
    nodes += [helper.make_node("Sum", names, ["s"], name="sum"), helper.make_node("Relu", ["s"], ["y"])]
    inits = [weights(f"w{i}", (8, 4, 3, 3)) for i in range(count)]
    m = model(nodes, [tensor("x", [1, 4, 7, 7])], [tensor("y", [1, 8, 7, 7])], inits)
    cm = compile_saved(tmp_path, m, normal((16, 4, 7, 7)))
    ops = unfused_layers(cm)
    assert ops.count(("Add", "npu")) == count - 1 and all(p == "npu" for _, p in ops), ops
    x = normal((1, 4, 7, 7), seed=4)
    check_float(cm, m, x)
    compare_int8(cm, x)


def qdq_several_quantize_model() -> onnx.ModelProto:
    """A QDQ model as some toolchains write it: the input quantised once per consumer (two copies
    with the same parameters, one with others), and a float result that is also a graph output."""
    q = [("s1", 0.02), ("s2", 0.035), ("sr", 0.015), ("sy", 0.04)]
    inits = [const(n, v) for n, v in [*q, ("lo", -0.5), ("hi", 0.5)]]
    inits += [const("z", 0, np.int8), const("zy", -5, np.int8)]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s1", "z"], ["xq_a"]),
        helper.make_node("QuantizeLinear", ["x", "s1", "z"], ["xq_b"]),  # same parameters
        helper.make_node("QuantizeLinear", ["x", "s2", "z"], ["xq_c"]),  # other parameters
        helper.make_node("DequantizeLinear", ["xq_a", "s1", "z"], ["xa"]),
        helper.make_node("DequantizeLinear", ["xq_b", "s1", "z"], ["xb"]),
        helper.make_node("DequantizeLinear", ["xq_c", "s2", "z"], ["xc"]),
        helper.make_node("Relu", ["xa"], ["r"], name="relu"),
        helper.make_node("QuantizeLinear", ["r", "sr", "z"], ["rq"]),
        helper.make_node("DequantizeLinear", ["rq", "sr", "z"], ["rd"]),
        helper.make_node("Add", ["rd", "xc"], ["sum"], name="add"),
        helper.make_node("QuantizeLinear", ["sum", "sy", "zy"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"]),
        helper.make_node("Clip", ["xb", "lo", "hi"], ["cl"], name="clip"),
        helper.make_node("QuantizeLinear", ["cl", "s1", "z"], ["clq"]),
        helper.make_node("DequantizeLinear", ["clq", "s1", "z"], ["y2"]),
    ]
    outs = [tensor("y", [4, 16]), tensor("y2", [4, 16]), tensor("r", [4, 16])]
    return model(nodes, [tensor("x", [4, 16])], outs, inits, opset=13)


def test_qdq_tensor_quantised_for_several_consumers(tmp_path):
    m = qdq_several_quantize_model()
    cm = compile_saved(tmp_path, m)
    report = cm.report()
    assert "1 QuantizeLinear merged" in report and "1 QuantizeLinear requantised" in report
    assert "read as quantised by its other consumers" in report  # 'r' is also a graph output
    ops = [(la.op, la.placement) for la in cm.lowered.layers]
    assert all(p == "npu" for _, p in ops) and ("Add", "npu") in ops, ops
    x = np.random.default_rng(6).uniform(-1.8, 1.8, (4, 16)).astype(np.float32)
    compare_int8(cm, x)  # exact against the rewritten QDQ model
    # and within a few quantisation steps of the model as given ('r' is within its int8 range)
    for g, w, step in zip(cm.run(x), ort_outputs(m, x), (0.04, 0.02, 0.015), strict=True):
        assert np.abs(g - w).max() <= 2.01 * step, np.abs(g - w).max()


def test_channels_last_input_transpose_is_folded(tmp_path):
    """NHWC input -> Transpose(0,3,1,2) -> CNN: the compiled model takes the NHWC tensor directly."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["t", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    inits = [
        weights("cw", (8, 3, 3, 3)),
        weights("cb", (8,), 0.1),
        weights("fw", (4, 8)),
        weights("fb", (4,)),
    ]
    m = model(nodes, [tensor("x", [1, 10, 9, 3])], [tensor("y", [1, 4])], inits)
    cm = compile_saved(tmp_path, m, normal((16, 10, 9, 3)))
    assert "Transpose" not in [la.op for la in cm.lowered.layers]
    assert cm.lowered.inputs[0].shape == [1, 10, 9, 3] and cm.lowered.inputs[0].layout.kind == "nhwc"
    assert "channels-last" in cm.report()
    x = normal((1, 10, 9, 3), seed=8)
    check_float(cm, m, x)
    got = cm.run(x)[0]  # the Gemm's int32 accumulators, dequantised (compiler/outputs.py)
    want = ort_outputs(cm.qdq, np.ascontiguousarray(x.transpose(0, 3, 1, 2)))[0]
    assert cm.lowered.outputs[0].scales is not None
    assert np.abs(got - want).max() <= np.abs(want).max() / 127
    # the layout survives the container: saved, loaded and run from the file
    cm.to_container().save(tmp_path / "n.npub")
    back = Container.load(tmp_path / "n.npub")
    assert back.manifest.inputs[0].layout == cm.lowered.inputs[0].layout
    assert np.array_equal(run_container(back, [x], cm.cfg)[0][0], cm.run(x)[0])
    with pytest.raises(RunError, match=r"shape \[1, 3, 10, 9\], the model needs \[1, 10, 9, 3\]"):
        run_container(back, [x.transpose(0, 3, 1, 2)], cm.cfg)
    # calibration data is given as the input is: NHWC
    with pytest.raises(CompileError, match=r"calibration data for 'x' has shape \[16, 3, 10, 9\]"):
        compile_saved(tmp_path, m, normal((16, 3, 10, 9)))


def test_integer_input_is_refused_by_name(tmp_path):
    nodes = [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)]
    m = model(
        nodes,
        [tensor("ids", [1, 4], TensorProto.INT64)],
        [tensor("y", [1, 4, 8])],
        [weights("table", (10, 8))],
    )
    with pytest.raises(CompileError, match=r"graph input 'ids' is int64; the NPU takes float inputs"):
        compile_saved(tmp_path, m, np.zeros((4, 4), np.int64))


# ---- several graph inputs -------------------------------------------------------------------------


def two_input_model() -> onnx.ModelProto:
    """Two images, a convolution each, their sum: a model of two graph inputs."""
    nodes = [
        helper.make_node("Conv", ["a", "wa"], ["ca"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["b", "wb"], ["cb"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["ca", "cb"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    inputs = [tensor("a", [1, 3, 8, 8]), tensor("b", [1, 3, 8, 8])]
    inits = [weights("wa", (8, 3, 3, 3)), weights("wb", (8, 3, 3, 3))]
    return model(nodes, inputs, [tensor("y", [1, 8, 8, 8])], inits)


def test_model_of_two_inputs_calibrates_each(tmp_path, capsys):
    m = two_input_model()
    calib = {"a": normal((8, 3, 8, 8), 1), "b": 2 * normal((8, 3, 8, 8), 2)}
    cm = compile_saved(tmp_path, m, calib)
    assert [t.name for t in cm.manifest.inputs] == ["a", "b"]
    assert all(p == "npu" for _, p in unfused_layers(cm))
    xa, xb = normal((1, 3, 8, 8), 3), 2 * normal((1, 3, 8, 8), 4)
    got, want = cm.run(xa, xb)[0], ort_outputs(m, xa, xb)[0]
    assert cosine(got, want) >= 0.99
    compare_int8(cm, xa, xb)
    # the command line takes an .npz with one array per input name
    onnx.save(m, str(tmp_path / "two.onnx"))
    np.savez(tmp_path / "c.npz", **calib)
    assert main(["compile", str(tmp_path / "two.onnx"), "--calib", str(tmp_path / "c.npz"), "-o",
                 str(tmp_path / "two.npub")]) == 0  # fmt: skip
    assert [t.name for t in Container.load(tmp_path / "two.npub").manifest.inputs] == ["a", "b"]


@pytest.mark.parametrize(
    "calib, msg",
    [
        (normal((8, 3, 8, 8)), "the model has 2 graph inputs ['a', 'b']: give calibration data for each"),
        ({"a": normal((8, 3, 8, 8))}, "missing ['b']"),
        ({"a": normal((8, 3, 8, 8)), "b": normal((8, 3, 8, 8)), "c": normal((2,))}, "unknown ['c']"),
        ({"a": normal((8, 3, 8, 8)), "b": normal((4, 3, 8, 8))}, "different numbers of batches"),
    ],
)
def test_calibration_of_several_inputs_errors_name_the_inputs(tmp_path, calib, msg):
    with pytest.raises(CompileError, match=re.escape(msg)):
        compile_saved(tmp_path, two_input_model(), calib)
