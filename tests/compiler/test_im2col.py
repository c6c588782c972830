"""Strided convolutions of few input channels with their taps folded into k (compiler/im2col.py):
the same values as onnxruntime's QDQ model, one MATMUL per band instead of one per output row and
tap, and a graph input read only by them laid out without channel padding."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npu.compiler.im2col import _columns, folds, gather_loads
from npu.compiler.quantize import Act, QTensor
from npu.compiler.spatial import Geometry
from npu.config import PRESETS
from npu.isa import Opcode, decode_program
from npu.tensors import Layout
from tests.compiler.helpers import compare_int8, compile_model


def conv_model(cin, cout, kernel, strides, pads, dilations=(1, 1), shape=(1, 16, 16), relu=True, seed=0):
    """A float model of one Conv (and a Relu), NCHW input `(n, cin, h, w)` from `shape` (n, h, w)."""
    rng = np.random.default_rng(seed)
    n, h, w = shape
    kh, kw = kernel
    wt = rng.normal(0, np.sqrt(2 / (cin * kh * kw)), (cout, cin, kh, kw)).astype(np.float32)
    b = rng.normal(0, 0.05, cout).astype(np.float32)
    ekh, ekw = (kh - 1) * dilations[0] + 1, (kw - 1) * dilations[1] + 1
    oh = (h + pads[0] + pads[2] - ekh) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - ekw) // strides[1] + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=list(kernel),
                              strides=list(strides), pads=list(pads), dilations=list(dilations))]  # fmt: skip
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"], name="relu"))
    graph = helper.make_graph(
        nodes,
        "im2col",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, cin, h, w])],
        [helper.make_tensor_value_info("y" if relu else "c", TensorProto.FLOAT, [n, cout, oh, ow])],
        [onnx.numpy_helper.from_array(wt, "w"), onnx.numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _matmuls(cm) -> int:
    prog = decode_program(cm.to_container().blobs["program"])
    return sum(i.op == Opcode.MATMUL for i in prog)


CASES = [
    # cin, cout, kernel, strides, pads (t, l, b, r), dilations, (n, h, w)
    (1, 16, (10, 4), (2, 2), (4, 1, 5, 1), (1, 1), (1, 49, 10)),  # the keyword spotter's first layer
    (3, 8, (3, 3), (2, 2), (0, 0, 1, 1), (1, 1), (1, 24, 24)),  # MobileNet's, TensorFlow's "same"
    (3, 16, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), (2, 20, 18)),  # two frames, wide borders
    (2, 8, (3, 5), (3, 2), (2, 0, 1, 3), (2, 1), (1, 17, 23)),  # unequal strides, dilated rows
    (4, 8, (3, 3), (1, 2), (1, 1, 1, 1), (1, 1), (1, 9, 40)),  # stride 1 down, 2 across
    (3, 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1, 5, 64)),  # a LOAD per output row and tap row
]


@pytest.mark.parametrize("config", ["default", "banked", "ulx3s128"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "c{}-k{}x{}-s{}x{}".format(c[0], *c[2], *c[3]))
@pytest.mark.parametrize("act", ["int8", "int16"])
def test_folded_convolutions_match_onnxruntime(tmp_path, config, case, act):
    cin, cout, kernel, strides, pads, dil, shape = case
    model = conv_model(cin, cout, kernel, strides, pads, dil, shape)
    rng = np.random.default_rng(1)
    calib = rng.normal(0, 1, (8 * shape[0], cin, *shape[1:])).astype(np.float32)
    cm = compile_model(tmp_path, model, config, calib, activations=act, im2col="on")
    layer = next(la for la in cm.lowered.layers if la.op == "Conv")
    assert "taps folded into k" in layer.split
    # the input as the host writes it: no channel padding (its LOADs gather, no MATMUL reads it)
    assert cm.lowered.inputs[0].layout.cp == cin
    x = rng.normal(0, 1, (shape[0], cin, *shape[1:])).astype(np.float32)
    compare_int8(cm, x)


@pytest.mark.parametrize(
    "cin, kernel, pads, shape, folded",
    [
        (1, (10, 4), (4, 1, 5, 1), (1, 49, 10), True),  # the keyword spotter's first layer
        (3, (3, 3), (0, 0, 1, 1), (1, 96, 96), False),  # MobileNet's: a gathered pixel a DMA row
    ],
    ids=["kws", "mobilenet"],
)
def test_auto_folds_where_the_cost_model_finds_it_cheaper(tmp_path, cin, kernel, pads, shape, folded):
    """On the 128-MAC ULX3S preset (16-bit SDRAM: a DMA row costs a burst), the keyword spotter's
    first layer folds (a MATMUL per band and chunk, where the taps took one per output row and tap),
    MobileNet-0.25's does not (its gather is a burst per output pixel and tap row); either way the
    choice is the faster program on the golden model."""
    model = conv_model(cin, 64, kernel, (2, 2), pads, shape=shape)
    calib = np.random.default_rng(1).normal(0, 1, (8, cin, *shape[1:])).astype(np.float32)
    modes = ("auto", "on", "off")
    cms = {f: compile_model(tmp_path, model, "ulx3s128", calib, name=f, im2col=f) for f in modes}
    split = next(la.split for la in cms["auto"].lowered.layers if la.op == "Conv")
    assert ("taps folded into k" in split) == folded
    assert (cms["auto"].lowered.inputs[0].layout.cp == cin) == folded
    cycles = {f: cm._npu_cycles() for f, cm in cms.items()}
    assert cycles["auto"] == min(cycles.values()), cycles
    if folded:
        rows = (shape[1] + pads[0] + pads[2] - kernel[0]) // 2 + 1
        assert _matmuls(cms["auto"]) < rows * kernel[0] * kernel[1] // 10


def test_a_band_wider_than_the_scratchpad_is_split_into_strips(tmp_path):
    """One output row of the folded input (200 pixels of 7 x 7 x 3 int16 elements) is more than the
    128-MAC ULX3S preset's activation half of the scratchpad: strips of the width, each gathered."""
    model = conv_model(3, 8, (7, 7), (2, 2), (3, 3, 3, 3), shape=(1, 8, 400))
    rng = np.random.default_rng(2)
    cm = compile_model(tmp_path, model, "ulx3s128", rng.normal(0, 1, (8, 3, 8, 400)).astype(np.float32),
                       activations="int16", im2col="on")  # fmt: skip
    split = next(la.split for la in cm.lowered.layers if la.op == "Conv")
    assert "width x" in split and "taps folded into k" in split
    compare_int8(cm, rng.normal(0, 1, (1, 3, 8, 400)).astype(np.float32))


def test_an_input_other_operators_read_keeps_its_channel_padding(tmp_path):
    """A graph input that a stride-1 convolution reads too (its MATMULs read the input's pixels as
    they are, lane-aligned) keeps the default layout; the strided one still folds."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["a"], name="strided", strides=[2, 2], pads=[1, 1, 1, 1]),
            helper.make_node("Conv", ["x", "w2"], ["b"], name="plain", pads=[1, 1, 1, 1]),
        ],
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 8, 6, 6]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 8, 12, 12]),
        ],
        [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    calib = rng.normal(0, 1, (8, 3, 12, 12)).astype(np.float32)
    cm = compile_model(tmp_path, model, "default", calib, im2col="on")
    assert cm.lowered.inputs[0].layout.cp % PRESETS["default"].lanes == 0
    split = {la.node: la.split for la in cm.lowered.layers}
    assert "taps folded into k" in split["strided"] and "taps folded" not in split["plain"]
    compare_int8(cm, rng.normal(0, 1, (1, 3, 12, 12)).astype(np.float32))


@pytest.mark.parametrize("config", ["default", "ulx3s"])
def test_a_folded_convolution_reads_what_the_layer_before_stored(tmp_path, config):
    """A folded convolution inside a network: its gathering LOADs read the previous layer's output,
    which the program's tokens must have them wait for (the DMA rows overlap in DRAM)."""
    rng = np.random.default_rng(3)
    w1 = rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (16, 4, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["a"], name="first", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["a"], ["r"], name="relu"),
            helper.make_node("Conv", ["r", "w2"], ["y"], name="strided", strides=[2, 2], pads=[1, 1, 1, 1]),
        ],
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 20, 18])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 10, 9])],
        [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    calib = rng.normal(0, 1, (8, 3, 20, 18)).astype(np.float32)
    cm = compile_model(tmp_path, model, config, calib, im2col="on")
    split = {la.node: la.split for la in cm.lowered.layers}
    assert "taps folded into k" in split["strided"]
    compare_int8(cm, rng.normal(0, 1, (1, 3, 20, 18)).astype(np.float32))


def test_a_row_of_output_pixels_away_from_the_border_is_one_load():
    """ResNet-50's first layer (7 x 7, stride 2, pad 3, 224 wide): a band of one output row gathers
    in 7 tap rows x 4 runs of columns (two at the left border, the middle 109, one at the right)."""
    x = Act(QTensor("x", (1, 3, 224, 224), 1.0, 0), 0, Layout.hwc((1, 3, 224, 224), 1, cp=3))
    g = Geometry(1, 224, 224, 112, 112, 7, 7, 2, 2, 3, 3, 3, 3)
    assert [(c0, n) for c0, n, *_ in _columns(x, g, 0, 112)] == [(0, 1), (1, 1), (2, 109), (111, 1)]
    assert gather_loads(x, g, 1, 0, 112) == (7 * 4, 7 * 112)


def test_what_folds():
    cfg = PRESETS["banked"]  # 8 lanes, int16 A at half rate: 4 int16 channels an A word
    assert folds(cfg, (3, 3), (2, 2), (1, 1), 1, 3, 1)
    assert folds(cfg, (3, 3), (2, 2), (2, 1), 1, 8, 1)  # dilated rows: a tap row is still contiguous
    assert folds(cfg, (10, 4), (2, 2), (1, 1), 1, 4, 2)  # int16: four channels fill the word
    assert not folds(cfg, (3, 3), (1, 1), (1, 1), 1, 3, 1)  # stride 1: a MATMUL per tap covers a band
    assert not folds(cfg, (3, 3), (2, 2), (1, 2), 1, 3, 1)  # dilated columns: a tap row has gaps
    assert not folds(cfg, (3, 3), (2, 2), (1, 1), 3, 3, 1)  # grouped
    assert not folds(cfg, (1, 1), (2, 2), (1, 1), 1, 3, 1)  # one tap: nothing to fold
    assert not folds(cfg, (3, 3), (2, 2), (1, 1), 1, 16, 1)  # a pixel wider than an A word
    assert not folds(cfg, (3, 3), (2, 2), (1, 1), 1, 8, 2)  # int16 pixel of 8 channels: two words
    assert folds(PRESETS["default"], (3, 3), (2, 2), (1, 1), 1, 8, 2)  # there int16 takes int8's steps
    # the micro core: its MATMULs cost thousands of cycles each, so stride 1 folds too
    assert folds(PRESETS["icebreaker"], (3, 3), (1, 1), (1, 1), 1, 1, 1)
    assert not folds(PRESETS["icebreaker"], (3, 3), (1, 1), (1, 1), 1, 8, 1)  # two A words a pixel


def test_the_micro_core_folds_a_stride_one_convolution_where_it_pays(tmp_path):
    """On `icebreaker` (the micro core) a 3 x 3 stride-1 convolution of one input channel - the
    digits CNN's first layer - folds under `auto`: one MATMUL a band instead of one a tap, the
    fastest of auto, on and off on the golden model, and the same values as onnxruntime."""
    model = conv_model(1, 8, (3, 3), (1, 1), (1, 1, 1, 1), shape=(1, 8, 8))
    rng = np.random.default_rng(3)
    calib = rng.normal(0, 1, (8, 1, 8, 8)).astype(np.float32)
    cms = {
        f: compile_model(tmp_path, model, "icebreaker", calib, name=f, im2col=f)
        for f in ("auto", "on", "off")
    }
    split = next(la.split for la in cms["auto"].lowered.layers if la.op == "Conv")
    assert "taps folded into k" in split
    assert _matmuls(cms["auto"]) < _matmuls(cms["off"]) // 4
    cycles = {f: cm._npu_cycles() for f, cm in cms.items()}
    assert cycles["auto"] == min(cycles.values()) < cycles["off"], cycles
    compare_int8(cms["auto"], rng.normal(0, 1, (1, 1, 8, 8)).astype(np.float32))
