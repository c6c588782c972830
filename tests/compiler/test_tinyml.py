"""The MLPerf Tiny reference architectures of the zoo (seeded weights) through the compiler with its
default options: every convolution and dense layer on the NPU, outputs within cosine 0.99 of
onnxruntime float on every held-out input of the golden model; on the iCEBreaker's 64 KiB of DRAM
none fits (the data alone, before any program), and the compiler says so with the sizes."""

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu.compiler.cleanup import cleanup
from npu.compiler.dram import BASE
from npu.compiler.errors import DramTooSmall
from npu.models import zoo
from npu.sim.golden.runner import run_container
from tests.compiler.helpers import compile_model, cosine, on_npu, ort_outputs

#: MobileNetV1-0.25 at 96x96 compiles in about 8 s on the ULX3S (its int8 weights lose one of its
#: calibration samples: int16 weights in 13 layers), and its four inputs run on the golden model
#: take most of a minute: in `make test-all`
CASES = [
    "ds_cnn_kws",
    "resnet8",
    "fc_autoencoder",
    pytest.param("mobilenet_v1_025_vww", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name", CASES)
def test_tinyml_models_match_onnxruntime_float_on_the_ulx3s(tmp_path, name, capsys):
    z = zoo.TINYML[name]()
    cm = compile_model(tmp_path, z.model, "ulx3s", z.calib, name, activations="auto")
    # on the NPU: each its own operator, or computed by the one before it (a 1 x 1 after a depthwise)
    convs = [(la.op, la.placement, on_npu(la)) for la in cm.lowered.layers if la.op in ("Conv", "Gemm")]
    assert convs and all(npu for *_, npu in convs), convs
    assert cm.placement.macs_host == 0
    if name == "ds_cnn_kws":  # its depthwise and 1 x 1 layers as one operator (compiler/pointwise.py)
        assert any("(1 x 1) on each band" in la.split for la in cm.lowered.layers), convs
    # every output, the softmax too: the logits are an output beside it (`normalise_logits` gives
    # them a trained-like spread), so a saturated softmax cannot hide an error
    least, cycles = None, set()
    for i in range(len(z.test)):
        x = z.test[i : i + 1]
        got, counters = run_container(cm.to_container(), [x], cm.cfg)
        cos = np.array([cosine(g, w) for g, w in zip(got, ort_outputs(z.model, x), strict=True)])
        least = cos if least is None else np.minimum(least, cos)
        cycles.add(counters["CYCLES"])
    with capsys.disabled():
        print(
            f"\n{name} on ulx3s: compile {cm.compile_s:.1f} s, golden-model cycles {sorted(cycles)}, least "
            f"cosine per output over {len(z.test)} inputs {np.round(least, 5).tolist()}; {cm.quantisation}"
        )
    assert least.min() >= 0.99, least


@pytest.mark.parametrize("name", CASES)
def test_tinyml_models_do_not_fit_the_icebreaker_and_are_refused_with_their_sizes(tmp_path, name):
    """int8 activations: the smallest tensors, and the last type `auto` tries (after the mix and int16,
    which do not fit either: the same error, three compilations later)."""
    z = zoo.TINYML[name]()
    with pytest.raises(DramTooSmall, match=r"more than the 65536 bytes of DRAM on icebreaker: ") as e:
        compile_model(tmp_path, z.model, "icebreaker", z.calib, name, activations="int8")
    sizes = re.search(r"(\d+) bytes of constants, (\d+) of activations .*, (\d+) of program", str(e.value))
    assert sizes, str(e.value)
    consts, acts, program = map(int, sizes.groups())
    # the sizes it names do exceed it (the keyword spotter's constants and activations fit since its
    # depthwise weights are a block a tile, spatial._packs: its program, 662 KB, does not)
    assert BASE + consts + acts + program > 65536 and program > 0, str(e.value)


def _two_layers_sharing_a_weight(op: str) -> onnx.ModelProto:
    """Two Gemms (or Convs) of one weight initialiser, each followed by its own BatchNormalization."""
    rng = np.random.default_rng(0)
    c, shape = (8, [1, 16]) if op == "Gemm" else (4, [1, 3, 6, 6])
    w = rng.normal(0, 0.3, (8, 16) if op == "Gemm" else (4, 3, 3, 3))
    inits = [numpy_helper.from_array(w.astype(np.float32), "w")]
    inits.append(numpy_helper.from_array(rng.normal(0, 0.1, c).astype(np.float32), "b"))
    attrs = {"transB": 1} if op == "Gemm" else {"pads": [1, 1, 1, 1]}
    nodes = []
    for i in (1, 2):
        stats = (
            rng.uniform(0.5, 1.5, c),
            rng.normal(0, 0.1, c),
            rng.normal(0, 0.1, c),
            rng.uniform(0.5, 1.5, c),
        )
        names = [f"bn{i}_{k}" for k in ("scale", "shift", "mean", "var")]
        inits += [numpy_helper.from_array(v.astype(np.float32), n) for v, n in zip(stats, names, strict=True)]
        nodes += [
            helper.make_node(op, ["x", "w", "b"], [f"h{i}"], **attrs),
            helper.make_node("BatchNormalization", [f"h{i}", *names], [f"y{i}"]),
        ]
    out = [1, c] if op == "Gemm" else [1, c, 6, 6]
    g = helper.make_graph(
        nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, out) for i in (1, 2)], inits,
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("op", ["Gemm", "Conv"])
def test_batchnorm_folds_into_each_of_two_layers_sharing_a_weight(op):
    """The autoencoder's BatchNormalization after a Gemm folds into it (compiler/cleanup.py); folded
    weights are named per node, so a weight two layers share folds once for each (it was one name,
    the second fold overwriting the first)."""
    m = _two_layers_sharing_a_weight(op)
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    folded = cleanup(m)
    assert [n.op_type for n in folded.graph.node] == [op, op]
    for got, want in zip(ort_outputs(folded, x), ort_outputs(m, x), strict=True):
        assert np.allclose(got, want, atol=1e-5)


def test_batchnorm_after_a_gemm_with_a_bias_per_row_stays():
    """A Gemm bias of one row per sample (M x N) is not one per output column: the BatchNormalization
    stays a node (folding it raised a numpy broadcasting error)."""
    rng = np.random.default_rng(2)
    stats = (rng.uniform(0.5, 1.5, 8), rng.normal(0, 0.1, 8), rng.normal(0, 0.1, 8), rng.uniform(0.5, 1.5, 8))
    names = ["scale", "shift", "mean", "var"]
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 16)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (2, 8)).astype(np.float32), "b"),
        *(numpy_helper.from_array(v.astype(np.float32), n) for v, n in zip(stats, names, strict=True)),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
        helper.make_node("BatchNormalization", ["h", *names], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], inits,
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    folded = cleanup(m)
    assert [n.op_type for n in folded.graph.node] == ["Gemm", "BatchNormalization"]
    x = rng.normal(size=(2, 16)).astype(np.float32)
    assert np.allclose(ort_outputs(folded, x)[0], ort_outputs(m, x)[0], atol=1e-5)
