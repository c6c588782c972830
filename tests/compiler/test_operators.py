"""Every NPU operator and its main attribute variants against onnxruntime running the same QDQ model:
int8 outputs within 1 LSB on at least 99 % of the elements."""

import numpy as np
import onnx
import pytest

from npu.compiler import compile_onnx
from npu.container import HostTensor
from npu.isa import Opcode, decode_program
from npu.models.builder import Net
from tests.compiler.helpers import compare_int8, compile_model, on_npu


def calib_for(shape, n=16, seed=0):
    return np.random.default_rng(seed).normal(0, 1, (n * shape[0], *shape[1:])).astype(np.float32)


def check(tmp_path, net: Net, outs, config="default", seed=1):
    model = net.model(outs)
    shape = net.shapes[net.input]
    cm = compile_model(tmp_path, model, config, calib_for(shape))
    x = np.random.default_rng(seed).normal(0, 1, shape).astype(np.float32)
    compare_int8(cm, x)
    return cm


CONVS = [
    # cin, cout, k, stride, pad, groups, h, w
    (3, 10, 3, 1, 1, 1, 12, 11),
    (8, 16, 1, 1, 0, 1, 9, 9),
    (5, 12, 5, 2, 2, 1, 15, 13),
    (16, 16, 3, 2, 1, 16, 10, 10),  # depthwise
    (12, 24, 3, 1, 0, 3, 8, 9),  # grouped
    (16, 32, 3, 1, 1, 2, 7, 7),
    (8, 8, (1, 7), 1, None, 1, 6, 14),  # asymmetric kernel
]


def conv_net(spec) -> tuple[Net, str]:
    """A network of one convolution of a CONVS entry, and its output."""
    cin, cout, k, s, p, g, h, w = spec
    net = Net("conv", (1, cin, h, w), seed=sum(map(hash, map(str, spec))) % 1000)
    pad = 0 if isinstance(k, tuple) else p
    return net, net.conv(net.input, cout, k, stride=s, pad=pad, groups=g, relu=False)


@pytest.mark.parametrize("config", ["tiny", "default", "banked"])
@pytest.mark.parametrize("spec", CONVS, ids=lambda s: "c{}-{}-k{}-s{}-p{}-g{}".format(*s[:6]))
def test_conv(tmp_path, config, spec):
    net, y = conv_net(spec)
    cm = check(tmp_path, net, [y], config)
    assert [la.op for la in cm.lowered.layers] == ["Conv"]


def test_conv_matmuls_skip_the_channel_padding(tmp_path):
    """On the ULX3S preset a 64-channel map's pixel is 72 channels (its pitch off the banks'
    period): the MATMULs of a 1 x 1 convolution over it read the 64 that hold data (k), the rest
    having zero weights, and the values stay onnxruntime's."""
    net = Net("pad", (1, 64, 6, 7), seed=4)
    y = net.conv(net.input, 64, 1, relu=False)
    cm = check(tmp_path, net, [y], "ulx3s")
    prog = decode_program(cm.to_container().blobs["program"])
    ks = {i.fields["k"] for i in prog if i.op == Opcode.MATMUL and i.fields["accumulate"]}
    assert cm.lowered.inputs[0].layout.cp == 72 and ks == {64}


@pytest.mark.parametrize("config", ["tiny", "default", "banked"])
@pytest.mark.parametrize(
    "spec",
    [(8, 16, 3, 1, 2, 1, 13, 12), (8, 8, 3, 2, 3, 1, 17, 15), (16, 16, 3, 1, 4, 16, 12, 12)],
    ids=["d2", "d3-s2", "d4-depthwise"],
)
def test_dilated_conv(tmp_path, config, spec):
    """Dilated (atrous) convolution, as segmentation networks use it: the taps `dilation` pixels apart."""
    cin, cout, k, s, d, g, h, w = spec
    net = Net("dil", (1, cin, h, w), seed=d)
    y = net.conv(net.input, cout, k, stride=s, groups=g, relu=False, dilation=d)
    cm = check(tmp_path, net, [y], config)
    assert [(la.op, la.placement) for la in cm.lowered.layers] == [("Conv", "npu")]


def test_dilated_conv_split_into_row_bands(tmp_path):
    """The band's halo is the dilated kernel's: (k - 1) * dilation rows shared with the next band."""
    shape = (1, 32, 128, 128)
    net = Net("dilbig", shape, seed=3)
    y = net.conv(net.input, 32, 3, relu=False, dilation=6)
    cm = compile_model(tmp_path, net.model([y]), "default", calib_for(shape, n=2))
    assert "halo 12" in cm.lowered.layers[0].split, cm.lowered.layers[0].split
    compare_int8(cm, np.random.default_rng(4).normal(0, 1, shape).astype(np.float32))


@pytest.mark.parametrize("hw", [7, 14])
def test_wide_depthwise_conv_plans_its_channel_tiles(tmp_path, hw):
    """A 5x5 depthwise convolution of 512 channels (MobileNet-style heads): the planner sizes a tile's
    input window by the channels its output tile reads, as the emitter does (it used to plan 8 input
    channels for a tile of 512 and fail an assertion in the emitter)."""
    net = Net("dw", (1, 512, hw, hw), seed=9)
    y = net.conv(net.input, 512, 5, groups=512, relu=False)
    cm = check(tmp_path, net, [y], "default")
    assert cm.lowered.layers[0].tile["ci"] <= 64  # the tiles stay near the groups they read


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_conv_bands_hold_only_the_tiles_channels(tmp_path, stride):
    """A depthwise convolution of 256 channels: the input is read about once - each output tile's
    bands hold only the channels it reads (one DMA row per pixel, its border pixels as pad rows), or
    one tile of every channel, its chunks' weights in one block (`spatial._packs`) - never every
    channel once per tile; each MATMUL spans only the output columns its input chunk feeds, and the
    instructions are in the order they can start (npu.program.start_order). The layer then runs near
    its compute bound - the array's depthwise bound is one useful lane of `lanes` - instead of at the
    load unit's pace (before: 2.4x its compute cycles at stride 1, utilisation 0.01-0.05)."""
    net = Net("dw256", (1, 256, 28, 28), seed=5)
    y = net.conv(net.input, 256, 3, stride=stride, pad=1, groups=256, relu=False)
    shape = net.shapes[net.input]
    # points at the operator's boundaries only: each point inside drains the units (its own cost)
    cm = compile_model(tmp_path, net.model([y]), "default", calib_for(shape), max_pause_us=0)
    compare_int8(cm, np.random.default_rng(1).normal(0, 1, shape).astype(np.float32))
    cfg, (layer,) = cm.cfg, cm.lowered.layers
    macs = 256 * 9 * (28 // stride) ** 2
    util = macs / (layer.est_cycles * cfg.macs_per_cycle)
    assert layer.est_cycles <= 1.25 * layer.compute_cycles, (layer.est_cycles, layer.compute_cycles)
    assert util > 0.05, (util, layer.split)
    loads = [i.fields for i in cm.lowered.program if i.op == Opcode.LOAD and i.fields["rows"]]
    px = 256  # the input's pixel in DRAM: its bands are read a pixel or an input row a DMA row
    # (a pixel of a plane of columns by their phase: `stride` pixels apart)
    bands = [f for f in loads if f["dram_stride"] in (px, stride * px, 28 * px)]
    read = sum(f["rows"] * f["cols"] for f in bands)
    # the input once, with the rows bands share at stride 2 (a tile's band per tile: 32 times)
    assert bands and read <= 1.3 * 28 * 28 * px, (read, layer.split)
    # every channel at once only as the one output tile
    assert all(f["cols"] <= layer.tile["co"] for f in bands if f["dram_stride"] < 28 * px), layer.split


@pytest.mark.parametrize("config", ["banked", "default"])
def test_depthwise_conv_of_int16_input_runs_a_matmul_per_a_word(tmp_path, config):
    """int16 input where the array takes int16 A at half rate (`banked`): a depthwise chunk's
    MATMULs span one A word of channels each (lanes / 2), so no k step multiplies only zero weights
    (a chunk-wide MATMUL took twice the steps: the array's int16 depthwise bound was 1/16 of its
    MACs, now 1/8 as at int8; on `default`, then, utilisation 0.057 at stride 1, 249,405 cycles,
    went to 0.097, 145,497). Where it takes int16 at the int8 rate (`default`) a chunk-wide MATMUL
    already has int8's steps and the MATMULs are not split. Bit-exact against onnxruntime."""
    net = Net("dw256", (1, 256, 28, 28), seed=5)
    y = net.conv(net.input, 256, 3, pad=1, groups=256, relu=False)
    shape = net.shapes[net.input]
    cm = compile_model(
        tmp_path, net.model([y]), config, calib_for(shape), max_pause_us=0, activations="int16"
    )
    compare_int8(cm, np.random.default_rng(1).normal(0, 1, shape).astype(np.float32))
    cfg, (layer,) = cm.cfg, cm.lowered.layers
    mms = [i.fields for i in cm.lowered.program if i.op == Opcode.MATMUL]
    mms = [f for f in mms if f["a_stride"] or f["accumulate"]]  # not the bias's (compiler/bias.py)
    narrow = [f["k"] == cfg.lanes // 2 for f in mms]
    assert mms and all(f["a_i16"] for f in mms)
    assert all(narrow) if not cfg.a16_full_rate else not any(narrow)
    assert 256 * 9 * 28 * 28 / (layer.est_cycles * cfg.macs_per_cycle) > 0.08, layer.est_cycles


@pytest.mark.parametrize("config", ["tiny", "default", "banked"])
@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_conv_of_int16_input(tmp_path, config, stride):
    """The same on every configuration and stride, with channels the MATMULs of one word do not
    cover evenly (20: a chunk's last word is half padding)."""
    net = Net("dw20", (1, 20, 9, 9), seed=7)
    y = net.conv(net.input, 20, 3, stride=stride, pad=1, groups=20, relu=False)
    shape = net.shapes[net.input]
    cm = compile_model(tmp_path, net.model([y]), config, calib_for(shape), activations="int16")
    compare_int8(cm, np.random.default_rng(2).normal(0, 1, shape).astype(np.float32))


@pytest.mark.parametrize("config", ["tiny", "default", "banked"])
def test_conv_batchnorm_relu_batch2(tmp_path, config):
    net = Net("bn", (2, 6, 10, 10), seed=4)
    y = net.conv(net.input, 12, 3, bn=True, relu=True)
    cm = check(tmp_path, net, [y], config)
    assert [la.op for la in cm.lowered.layers] == ["Conv"]  # BN folded, Relu fused by the quantiser
    assert "frame x2" in cm.lowered.layers[0].split


@pytest.mark.parametrize("config", ["tiny", "default", "banked"])
@pytest.mark.parametrize("kind", ["max2", "max3p1", "max5s1p2", "avg2", "avg3p1_incl", "gap"])
def test_pooling(tmp_path, config, kind):
    net = Net("pool", (1, 12, 11, 10), seed=7)
    x = net.conv(net.input, 12, 3)
    y = {
        "max2": lambda: net.maxpool(x, 2, 2),
        "max3p1": lambda: net.maxpool(x, 3, 2, 1),
        "max5s1p2": lambda: net.maxpool(x, 5, 1, 2),  # a spatial-pyramid pool: two separable passes
        "avg2": lambda: net.avgpool(x, 2, 2),
        "avg3p1_incl": lambda: net.avgpool(x, 3, 1, 1, count_include_pad=1),
        "gap": lambda: net.gap(x),
    }[kind]()
    cm = check(tmp_path, net, [y], config)
    assert [la.placement for la in cm.lowered.layers] == ["npu", "npu"]
    assert ("separable" in cm.lowered.layers[1].split) == (kind == "max5s1p2"), cm.lowered.layers[1].split


def test_average_pool_excluding_padding_runs_on_the_host(tmp_path):
    net = Net("pool", (1, 8, 8, 8), seed=2)
    y = net.conv(net.avgpool(net.conv(net.input, 8, 3), 3, 1, 1), 8, 1)
    cm = check(tmp_path, net, [y])
    assert [la.placement for la in cm.lowered.layers] == ["npu", "host", "npu"]
    assert [s.kind for s in cm.lowered.segments] == ["npu", "host", "npu"]


@pytest.mark.parametrize("config", ["tiny", "default", "banked"])
def test_concat_with_channel_gaps_then_conv_and_gemm(tmp_path, config):
    """Channel counts that are not multiples of the lane count leave gaps in the concatenated pitch;
    the next convolution and the flattened Gemm see the real channels only."""
    net = Net("cat", (1, 4, 6, 6), seed=9)
    parts = [net.conv(net.input, c, 3) for c in (5, 8, 3)]
    cat = net.concat(parts)
    y = net.conv(cat, 7, 3, relu=False)
    z = net.gemm(net.flatten(cat), 6)
    cm = check(tmp_path, net, [y, z, cat], config)
    ops = [la.op for la in cm.lowered.layers]
    assert ops.count("Concat") == 1 and ops.count("Flatten") == 1


@pytest.mark.parametrize("config", ["tiny", "default", "banked"])
def test_residual_add_and_clip(tmp_path, config):
    net = Net("res", (1, 8, 9, 9), seed=5)
    a = net.conv(net.input, 16, 3)
    b = net.conv(a, 16, 3, relu=False)
    y = net.clip(net.add(a, b), -1.0, 2.0)
    check(tmp_path, net, [y], config)


def test_flatten_then_gemm_and_host_softmax(tmp_path):
    net = Net("head", (2, 6, 5, 5), seed=12)
    f = net.flatten(net.conv(net.input, 10, 3))
    logits = net.gemm(f, 7)
    probs = net.softmax(logits)
    cm = check(tmp_path, net, [probs, logits])
    assert cm.lowered.layers[-1].placement == "host"
    # graph outputs at full precision (compiler/outputs.py): the probabilities stay float, the
    # logits (read by the host Softmax and as an output) are the Gemm's int32 accumulators
    assert isinstance(cm.lowered.outputs[0], HostTensor) and cm.lowered.outputs[1].scales is not None


def test_host_step_in_the_middle(tmp_path):
    """LRN between two convolutions: NPU, host, NPU segments, transparent to the caller."""
    net = Net("lrn", (1, 8, 8, 8), seed=3)
    y = net.conv(net.lrn(net.conv(net.input, 8, 3)), 8, 3)
    cm = check(tmp_path, net, [y])
    assert [s.kind for s in cm.lowered.segments] == ["npu", "host", "npu"]


def test_convolution_four_times_the_scratchpad_is_split(tmp_path):
    """A convolution whose input, weights and output take more than 4x the scratchpad (`default`)."""
    net = Net("big", (1, 32, 112, 112), seed=21)
    y = net.conv(net.input, 64, 3, relu=False)
    model = net.model([y])
    cm = compile_model(tmp_path, model, "default", calib_for((1, 32, 112, 112), n=4))
    compare_int8(cm, np.random.default_rng(1).normal(0, 1, (1, 32, 112, 112)).astype(np.float32))
    la = cm.lowered.layers[0]
    data = 32 * 112 * 112 + 64 * 112 * 112 + 64 * 32 * 9
    assert data >= 4 * cm.cfg.spad_bytes
    assert "height" in la.split and la.spad_bytes <= cm.cfg.spad_bytes


@pytest.mark.parametrize(
    ("config", "shape", "k", "stride"),
    [("tiny", (1, 8, 5, 200), 3, 1), ("tiny", (1, 8, 6, 301), 3, 2), ("default", (1, 16, 4, 2100), 1, 1)],
)
def test_convolution_wider_than_the_memories_is_split_into_strips(tmp_path, config, shape, k, stride):
    """Rows too long for one band (a detector head's 2100 anchors in a row): strips of the output
    width, each reading its input columns plus the `kw - stride` halo, borders padded."""
    net = Net("wide", shape, seed=5)
    y = net.conv(net.input, 8, k, stride=stride)
    cm = compile_model(tmp_path, net.model([y]), config, calib_for(shape, n=4))
    assert "width x" in cm.lowered.layers[0].split
    compare_int8(cm, np.random.default_rng(2).normal(0, 1, shape).astype(np.float32))


def test_pooling_split_by_channels_stays_inside_its_tensor(tmp_path):
    """Global average pooling over a map too large for one band of all 24 channels: channel tiles
    of 16 and 8 (the last tile is narrower, it must not read the next tensor). Without a pause
    budget: with one, a band's step is also bounded and the tiles are narrower still."""
    net = Net("gap24", (1, 24, 80, 80), seed=9)
    y = net.gap(net.conv(net.input, 24, 1))
    cm = compile_model(tmp_path, net.model([y]), "default", calib_for((1, 24, 80, 80), n=4), max_pause_us=0)
    assert "channel x2" in cm.lowered.layers[1].split
    compare_int8(cm, np.random.default_rng(3).normal(0, 1, (1, 24, 80, 80)).astype(np.float32))


@pytest.mark.parametrize(
    "config, shape",
    [
        ("tiny", (1, 8, 64, 40)),  # 20 KiB of one channel tile: more than the scratchpad
        ("default", (1, 8, 300, 12)),  # taller than a POOL window's 255 rows
        ("default", (2, 24, 160, 160)),  # a DBNet's squeeze-excite at 640 x 640: channel tiles too
    ],
)
def test_global_pooling_of_a_map_too_large_for_one_band(tmp_path, config, shape):
    """Row bands averaged on chip, then their means: within 1 LSB of onnxruntime on 99 %."""
    net = Net("gapbig", shape, seed=4)
    y = net.gap(net.conv(net.input, shape[1], 1))
    cm = compile_model(tmp_path, net.model([y]), config, calib_for(shape, n=2))
    assert "row groups on chip" in cm.lowered.layers[1].split, cm.lowered.layers[1].split
    assert [la.placement for la in cm.lowered.layers] == ["npu", "npu"]
    compare_int8(cm, np.random.default_rng(5).normal(0, 1, shape).astype(np.float32))


def _matmul_model(shape, bias: bool, relu: bool, second_constant: bool = True):
    """x (shape, last axis 32) @ W (32 x 16) [+ b] [-> Relu]; or, when not `second_constant`,
    (x @ W1) @ (x @ W2), a product of two activations (x square, 32 x 32)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(rng.normal(0, 0.2, s).astype(np.float32), name)
             for name, s in (("w", (32, 16)), ("w1", (32, 32)), ("w2", (32, 32)))]  # fmt: skip
    inits.append(numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), "b"))
    out_shape = [*shape[:-1], 16]
    if second_constant:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"])]
    else:
        nodes = [helper.make_node("MatMul", ["x", w], [a]) for w, a in (("w1", "a1"), ("w2", "a2"))]
        nodes.append(helper.make_node("MatMul", ["a1", "a2"], ["m"], name="attention"))
        out_shape, bias = list(shape), False
    outs = ["m"]
    if bias:
        nodes.append(helper.make_node("Add", ["m", "b"], ["a"]))
        outs.append("a")
    if relu:
        nodes.append(helper.make_node("Relu", [outs[-1]], ["r"]))
        outs.append("r")
    nodes[-1].output[0] = "y"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)
    g = helper.make_graph(nodes, "mm", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("shape", [(1, 6, 32), (4, 6, 32)])
@pytest.mark.parametrize("bias, relu", [(False, False), (True, False), (True, True)])
def test_matmul_of_an_activation_with_more_than_two_dimensions(tmp_path, shape, bias, relu):
    """A linear layer over a sequence (or any leading dimensions): one GEMM over the rows, the
    bias folded in (MatMul + Add -> Gemm between reshapes), a Relu folded into the output range."""
    from tests.compiler.helpers import compile_model, cosine, ort_outputs

    m = _matmul_model(shape, bias, relu)
    cm = compile_model(tmp_path, m, "default", calib_for(shape))
    assert cm.placement.mac_share == 1.0
    assert {la.op for la in cm.lowered.layers if la.placement == "npu"} & {"Gemm", "MatMul"}
    host = [la.op for la in cm.lowered.layers if la.placement == "host"]
    assert not {"Gemm", "MatMul", "Add"} & set(host), host
    x = np.random.default_rng(2).normal(0, 1, shape).astype(np.float32)
    compare_int8(cm, x)
    assert cosine(cm.run(x)[0], ort_outputs(m, x)[0]) > 0.99


def test_matmul_of_two_activations_runs_on_the_npu(tmp_path):
    """One GEMM per leading index, both operands symmetric (the quantiser makes them so), the
    second int8 and loaded column by column (compiler/ops/heads.py; attention in test_attention.py)."""
    from tests.compiler.helpers import compile_model, cosine, ort_outputs

    m = _matmul_model((1, 32, 32), False, False, second_constant=False)
    cm = compile_model(tmp_path, m, "default", calib_for((1, 32, 32)))
    mm = [la for la in cm.lowered.layers if la.node == "attention"]
    assert mm and mm[0].placement == "npu", mm
    x = np.random.default_rng(3).normal(0, 1, (1, 32, 32)).astype(np.float32)
    compare_int8(cm, x)
    assert cosine(cm.run(x)[0], ort_outputs(m, x)[0]) > 0.99


def _tcn_model(rng) -> onnx.ModelProto:
    """A small temporal CNN on (1, 8, 64) sequences: Conv1d, BN, Relu, MaxPool1d, a dilated Conv1d
    with a residual Add, a depthwise Conv1d, a Concat, an AveragePool1d, and a classifier; the
    Concat's (1, 32, 32) sequence is a second output."""
    from onnx import TensorProto, helper, numpy_helper

    def w(name, shape, s=0.3):
        return numpy_helper.from_array(rng.normal(0, s, shape).astype(np.float32), name)

    var = numpy_helper.from_array(np.abs(rng.normal(1, 0.1, 16)).astype(np.float32), "bn_v")
    inits = [w("w1", (16, 8, 5)), w("b1", (16,), 0.1), w("w2", (16, 16, 3)), w("w3", (16, 1, 3)),
             w("bn_s", (16,), 0.2), w("bn_b", (16,), 0.1), w("bn_m", (16,), 0.1), var,
             w("fw", (10, 32))]  # fmt: skip
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[2, 2], name="conv1"),
        n("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], name="bn"),
        n("Relu", ["bn"], ["r1"], name="relu1"),
        n("MaxPool", ["r1"], ["p1"], kernel_shape=[2], strides=[2], name="pool1"),
        n("Conv", ["p1", "w2"], ["c2"], pads=[2, 2], dilations=[2], name="conv2"),
        n("Relu", ["c2"], ["r2"], name="relu2"),
        n("Add", ["r2", "p1"], ["res"], name="residual"),
        n("Conv", ["res", "w3"], ["dw"], pads=[1, 1], group=16, name="dwconv"),
        n("Concat", ["dw", "res"], ["cat"], axis=1, name="concat"),
        n("AveragePool", ["cat"], ["ap"], kernel_shape=[3], strides=[2], name="pool2"),
        n("GlobalAveragePool", ["ap"], ["g"], name="gap"),
        n("Flatten", ["g"], ["f"], name="flatten"),
        n("Gemm", ["f", "fw"], ["y"], transB=1, name="fc"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 64])
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10]),
            helper.make_tensor_value_info("cat", TensorProto.FLOAT, [1, 32, 32])]  # fmt: skip
    g = helper.make_graph(nodes, "tcn", [x], outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("activations", ["int8", "auto"])
def test_one_dimensional_convolutions_run_on_the_npu_as_maps_of_height_one(tmp_path, activations):
    """Conv1d, MaxPool1d, AveragePool1d and what follows them (BN, Relu, Add, Concat, global pool)
    run on the NPU as 2-D operators of height 1; the graph's 3-D output is a view of the NPU's map
    (layout `ncw`) and survives the container; results follow onnxruntime float."""
    from npu.container import Container
    from tests.compiler.helpers import cosine, ort_outputs

    rng = np.random.default_rng(6)
    m = _tcn_model(rng)
    calib = rng.normal(0, 1, (16, 8, 64)).astype(np.float32)
    cm = compile_model(tmp_path, m, "default", calib, activations=activations)
    place = {la.node: "npu" if on_npu(la) else la.placement for la in cm.lowered.layers}
    for node in ("conv1", "pool1", "conv2", "residual", "dwconv", "concat", "pool2", "gap", "fc"):
        assert place[node] == "npu", (node, place)
    assert "1-D convolutions/poolings" in cm.report()
    back = Container.from_bytes(cm.to_container().to_bytes())
    layouts = {d.name: d.layout.kind for d in back.manifest.outputs if hasattr(d, "layout")}
    assert layouts["cat"] == "ncw", layouts
    for seed in range(3):
        xs = np.random.default_rng(100 + seed).normal(0, 1, (1, 8, 64)).astype(np.float32)
        got, ref = cm.run(xs), ort_outputs(m, xs)
        assert [g.shape for g in got] == [(1, 10), (1, 32, 32)]
        assert min(cosine(a, b) for a, b in zip(got, ref, strict=True)) > 0.99


def test_a_quantised_one_dimensional_convolution_stays_on_the_host(tmp_path):
    """A model quantised before it reaches the compiler (QDQ) keeps its 1-D convolution on the host,
    with the reason."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    rng = np.random.default_rng(7)
    m = _tcn_model(rng)
    src, qdq = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(m, str(src))
    batches = iter([{"x": rng.normal(0, 1, (1, 8, 64)).astype(np.float32)} for _ in range(4)])

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(batches, None)

    quantize_static(str(src), str(qdq), Reader(), quant_format=QuantFormat.QDQ)
    cm = compile_onnx(qdq, "default")
    place = {la.node: (la.placement, la.reason) for la in cm.lowered.layers if la.op == "Conv"}
    assert place["conv1"] == ("host", "a 1-D convolution (the NPU's are 2-D)"), place


def test_transformer_block_compiles_with_its_linear_layers_on_the_npu(tmp_path):
    """A pre-norm transformer block over a sequence (1 x 8 x 32): the Q/K/V, output and MLP
    projections (MatMul + bias on a 3-D activation) and the attention's products of two activations
    run on the NPU, LayerNormalization and Softmax on the host; the result follows onnxruntime."""
    from onnx import TensorProto, helper, numpy_helper

    from tests.compiler.helpers import cosine, ort_outputs

    rng = np.random.default_rng(12)
    d, t = 32, 8

    def w(name, shape, s=0.2):
        return numpy_helper.from_array(rng.normal(0, s, shape).astype(np.float32), name)

    inits = [w(f"w{p}", (d, d)) for p in "qkvo"] + [w(f"b{p}", (d,), 0.1) for p in "qkvo"]
    inits += [w("w1", (d, 64)), w("b1", (64,), 0.1), w("w2", (64, d)), w("b2", (d,), 0.1)]
    norm = (("g", np.ones(d, np.float32)), ("bt", np.zeros(d, np.float32)), ("sc", np.float32(d**-0.5)))
    inits += [numpy_helper.from_array(v, k) for k, v in norm]
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "g", "bt"], ["ln"], axis=-1)]
    for p in "qkv":
        nodes += [n("MatMul", ["ln", f"w{p}"], [f"{p}0"]), n("Add", [f"{p}0", f"b{p}"], [p])]
    nodes += [
        n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["s0"], name="scores"),
        n("Mul", ["s0", "sc"], ["s"]),
        n("Softmax", ["s"], ["p"], axis=-1),
        n("MatMul", ["p", "v"], ["a"], name="mix"),
        n("MatMul", ["a", "wo"], ["o0"]), n("Add", ["o0", "bo"], ["o"]), n("Add", ["o", "x"], ["r"]),
        n("MatMul", ["r", "w1"], ["h0"]), n("Add", ["h0", "b1"], ["h1"]), n("Relu", ["h1"], ["h"]),
        n("MatMul", ["h", "w2"], ["f0"]), n("Add", ["f0", "b2"], ["f"]), n("Add", ["f", "r"], ["y"]),
    ]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, t, d])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, t, d])
    g = helper.make_graph(nodes, "block", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    cm = compile_model(tmp_path, m, "default", rng.normal(0, 1, (16, t, d)).astype(np.float32))
    layers = {la.node: la for la in cm.lowered.layers}
    # the products of two activations too, since compiler/ops/heads.py (test_attention.py)
    assert layers["scores"].placement == layers["mix"].placement == "npu"
    assert sum(la.op == "Gemm" and la.placement == "npu" for la in cm.lowered.layers) == 6  # q k v o, MLP
    assert cm.placement.mac_share == 1.0
    xs = rng.normal(0, 1, (1, t, d)).astype(np.float32)
    assert cosine(cm.run(xs)[0], ort_outputs(m, xs)[0]) > 0.99


def test_an_lstm_on_the_host_counts_its_macs_there(tmp_path):
    """A recurrent cell the NPU does not run (one with a cell clip, which the front end does not
    unroll: compiler/rnn.py) is counted in the report's MACs on the host (per step,
    direction and batch row: the gates' products with the input and the hidden state), so the MAC
    share does not read 100 % with the LSTM's work left out."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(8)
    t, i, h = 6, 16, 32
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (1, 4 * h, i)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.normal(0, 0.3, (1, 4 * h, h)).astype(np.float32), "R"),
        numpy_helper.from_array(np.array([t, h], np.int64), "shape"),
        numpy_helper.from_array(rng.normal(0, 0.3, (h, 10)).astype(np.float32), "fw"),
    ]
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2], name="time_first"),
        helper.make_node("LSTM", ["xt", "W", "R"], ["Y"], hidden_size=h, name="lstm", clip=50.0),
        helper.make_node("Reshape", ["Y", "shape"], ["y2"], name="flat"),
        helper.make_node("MatMul", ["y2", "fw"], ["y"], name="fc"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, t, i])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [t, 10])
    g = helper.make_graph(nodes, "lstm", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    cm = compile_model(tmp_path, m, "default", rng.normal(0, 1, (8, t, i)).astype(np.float32))
    p = cm.placement
    assert p.macs_host == t * 4 * h * (i + h) and p.macs_npu == t * h * 10, p
    assert f"{t * h * 10:,} of {t * h * 10 + t * 4 * h * (i + h):,} MACs" in cm.report()
    assert "LSTM lstm: kept as one host operator (a cell clip)" in cm.report()


def test_a_program_too_large_with_narrow_depthwise_matmuls_takes_one_a_chunk(tmp_path):
    """On `tiny` (64 KiB of DRAM) a depthwise layer's MATMULs per A word (twice the MATMULs) leave
    no room for the program; the compile takes one MATMUL a chunk instead and says so."""
    net = Net("dwfit", (1, 3, 16, 16), seed=5)
    y = net.conv(net.input, 16, 3, bn=True)
    y = net.conv(y, 16, 3, groups=16)
    y = net.conv(y, 24, 3, stride=2)
    shape = net.shapes[net.input]
    calib = calib_for(shape, n=32)
    cm = compile_model(tmp_path, net.model([y]), "tiny", calib, activations="int16", max_pause_us=0)
    assert "--no-narrow-depthwise" in cm.report() and "did not fit" in cm.fit_note, cm.fit_note
    asked = compile_model(tmp_path, net.model([y]), "tiny", calib, activations="int16", max_pause_us=0,
                          narrow_depthwise=False)  # fmt: skip
    assert cm.program == asked.program and not asked.fit_note
    compare_int8(cm, np.random.default_rng(3).normal(0, 1, shape).astype(np.float32))
