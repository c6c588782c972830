"""A grouped convolution's output tile spanning several input chunks keeps one weight block for all
of them where no output column is fed by two chunks (compiler/spatial.py `_packs`): row c holds
column c's chunk's weights, the block is loaded once for the tile instead of every chunk's block
of mostly zeros each band. Bit for bit the program with a block a chunk, exact against
onnxruntime's QDQ model, with fewer weight bytes moved."""

import numpy as np
import pytest

from npu.compiler import spatial
from npu.isa import Opcode
from npu.models.builder import Net
from tests.compiler.helpers import assert_same_int8, compare_int8, compile_model
from tests.compiler.test_operators import calib_for


def _net(groups: int, channels: int):
    net = Net("packed", (1, channels, 12, 12), seed=7)
    y = net.conv(net.input, channels, 3, pad=1, groups=groups)
    return net, net.model([net.conv(y, 16, 1, pad=0, relu=False)])


def _weight_loads(cm) -> list[dict]:
    """The LOADs of the first (grouped) convolution's weights: a row an output channel of the tile,
    DRAM rows back to back (its bands' LOADs are a pixel or an input row a DMA row, at most 14
    here, its bias digits one row)."""
    conv = cm.lowered.layers[0]
    lo, hi = conv.pc
    loads = [i.fields for i in cm.lowered.program[lo:hi] if i.op == Opcode.LOAD]
    return [f for f in loads if f["dram_stride"] == f["cols"] and f["rows"] == conv.tile["co"]]


@pytest.mark.parametrize(
    ("groups", "config", "activations"),
    [
        (64, "ulx3s32", "int16"),  # depthwise, int16 on the half-rate array: a MATMUL an A word
        (64, "default", "int8"),
        (8, "ulx3s32", "int8"),  # 8 channels a group: a chunk a group
        (32, "tiny", "int8"),  # a narrow array, not banked
    ],
)
def test_packed_weights_are_bit_exact_and_move_fewer_bytes(tmp_path, monkeypatch, groups, config,
                                                         activations):  # fmt: skip
    channels = 32 if config == "tiny" else 64
    net, model = _net(groups, channels)
    calib = calib_for(net.shapes[net.input])
    x = np.random.default_rng(3).normal(0, 1, net.shapes[net.input]).astype(np.float32)
    opts = dict(activations=activations, accuracy_check=False, cancel_points=False)
    # the tile of every output channel, so that it has several chunks whichever way it is planned
    monkeypatch.setattr(spatial, "_tilings", _whole_tile(spatial._tilings))
    cm = compile_model(tmp_path, model, config, calib, name="packed", **opts)
    compare_int8(cm, x)
    conv = cm.lowered.layers[0]
    assert conv.tile["co"] >= channels > conv.tile["ci"], conv.tile  # int8: 72 on a banked pad
    packed = _weight_loads(cm)
    # one block for the one tile, a row an output channel
    assert len(packed) == 1 and packed[0]["rows"] == conv.tile["co"], (conv.tile, conv.split, packed)
    monkeypatch.setattr(spatial, "_packs", lambda reach: False)
    apart = compile_model(tmp_path, model, config, calib, name="apart", **opts)
    assert_same_int8(cm, apart, x)
    moved = [sum(f["rows"] * f["cols"] for f in _weight_loads(c)) for c in (cm, apart)]
    assert moved[0] * 2 <= moved[1], moved
    assert cm._npu_cycles() <= apart._npu_cycles(), (cm._npu_cycles(), apart._npu_cycles())


def _whole_tile(tilings):
    def pick(cfg, g, co_opts, *rest):
        return tilings(cfg, g, [max(co_opts)], *rest)

    return pick


def test_chunks_feeding_one_column_keep_a_block_each():
    """Groups of 12 channels in chunks of 8: a chunk reaches two groups' columns, which its
    neighbour reaches too, so the chunks cannot share a block."""
    assert spatial._packs([(0, 8), (8, 16), (16, 24)])
    assert not spatial._packs([(0, 12), (8, 24)])
    assert not spatial._packs([(0, 8)])  # one chunk: its block is the tile's already
    assert spatial._packs([(0, 8), (0, 0), (8, 16)])  # a chunk no column reads is left out


def test_the_planner_takes_packed_tiles_for_a_depthwise_layer_on_the_board(tmp_path):
    """The keyword spotter's depthwise layer (64 channels at 25 x 5, int16) on the 32-MAC ULX3S:
    tiles of several chunks, each tile's weights one block loaded once (before: a tile of a chunk,
    its band a DMA row a pixel of 16 bytes)."""
    net = Net("kwsdw", (1, 64, 25, 5), seed=1)
    model = net.model([net.conv(net.input, 64, 3, pad=1, groups=64, relu=False)])
    opts = dict(activations="int16", accuracy_check=False, cancel_points=False)
    cm = compile_model(tmp_path, model, "ulx3s32", calib_for(net.shapes[net.input]), **opts)
    conv = cm.lowered.layers[0]
    assert conv.tile["co"] > conv.tile["ci"], (conv.tile, conv.split)
    assert len(_weight_loads(cm)) == -(-64 // conv.tile["co"]), conv.split
