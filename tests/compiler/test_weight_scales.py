"""Per-output-channel weight scales: a weight whose channels differ widely in range keeps its narrow
channels' precision (requantised one run of equal channels at a time), and `auto` picks it.

The layers are built the way such weights arise in trained networks: the input channels are strongly
correlated (a shared signal plus a little noise each), "sum" channels add them with small weights and
"difference" channels subtract pairs with large ones, so both kinds of output have similar ranges
while their weights differ by about 100x."""

import numpy as np
import onnx
import pytest

from npu.compiler import compile_onnx
from npu.compiler.graph import CompileError
from npu.compiler.quantize import narrowest_channel, per_channel_choice
from npu.models.builder import Net
from tests.compiler.helpers import compare_int8, ort_outputs

SMALL = 0.01  # the sum channels' weights


def _weights(cout: int, cin: int, rng) -> np.ndarray:
    """(cout, cin): the first half sum every input with weights about SMALL, the rest subtract a
    random pair of inputs with weights +-1."""
    w = np.zeros((cout, cin))
    w[: cout // 2] = SMALL * rng.uniform(0.5, 1.5, (cout // 2, cin))
    for r in range(cout // 2, cout):
        i, j = rng.choice(cin, 2, replace=False)
        w[r, i], w[r, j] = 1.0, -1.0
    return w


def _inputs(shape, n: int, rng) -> np.ndarray:
    """`n` samples whose channels (axis 1) share one signal, plus 5 % noise each."""
    common = rng.normal(0, 1, (n * shape[0], 1, *shape[2:]))
    return (common + 0.05 * rng.normal(0, 1, (n * shape[0], *shape[1:]))).astype(np.float32)


def _model(kind: str, rng):
    if kind == "conv":
        net = Net("conv_pc", (1, 8, 9, 9), seed=5)
        w = _weights(16, 8, rng)[:, :, None, None]
        return net, net.conv(net.input, 16, 1, pad=0, relu=False, weight=w, bias=np.zeros(16))
    net = Net(f"{kind}_pc", (4, 32), seed=6)
    w = _weights(24, 32, rng)
    if kind == "gemm":  # B transposed: (out, in)
        return net, net.gemm(net.input, 24, weight=w, bias=np.zeros(24))
    return net, net.node("MatMul", [net.input, net.const(w.T.astype(np.float32))], (4, 24))


@pytest.mark.parametrize("kind", ["conv", "gemm", "matmul"])
def test_per_channel_keeps_narrow_channels(tmp_path, kind):
    rng = np.random.default_rng(1)
    net, y = _model(kind, rng)
    model = net.model([y])
    shape = net.shapes[net.input]
    calib, x = _inputs(shape, 16, rng), _inputs(shape, 1, rng)
    assert narrowest_channel(model) < 1 / 8 and per_channel_choice(model, "auto", kind)
    path = tmp_path / f"{kind}.onnx"
    onnx.save(model, str(path))
    (ref,) = ort_outputs(model, x)
    half = range(ref.shape[1] // 2)  # the sum channels
    want = np.take(ref, half, axis=1)
    err = {}
    for scales in ("per-channel", "per-tensor"):
        cm = compile_onnx(path, "default", calib=calib, weight_scales=scales)
        if scales == "per-channel":
            compare_int8(cm, x)  # the NPU matches onnxruntime running the same per-channel QDQ model
        got = np.take(cm.run(x)[0], half, axis=1)
        err[scales] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    # one scale per tensor leaves the sum channels' weights one or two int8 levels
    assert err["per-channel"] < 0.03 and err["per-channel"] < err["per-tensor"] / 2, err
    auto = compile_onnx(path, "default", calib=calib).run(x)[0]
    chosen = compile_onnx(path, "default", calib=calib, weight_scales="per-channel").run(x)[0]
    assert auto.tobytes() == chosen.tobytes()


def _gemm_model(w: np.ndarray) -> onnx.ModelProto:
    net = Net("plain", (1, w.shape[1]), seed=2)
    return net.model([net.gemm(net.input, w.shape[0], weight=w)])


def test_weight_scales_choice_is_checked():
    w = np.random.default_rng(2).uniform(0.5, 1.0, (8, 16))
    w[3] = 1e-6  # a dead unit is zero under either choice: it does not ask for per-channel scales
    model = _gemm_model(w)
    assert narrowest_channel(model) > 1 / 8 and not per_channel_choice(model, "auto", "m")
    w[5] *= 0.1  # a live channel with a tenth of the range: per-tensor scales would cost it 3 bits
    assert per_channel_choice(_gemm_model(w), "auto", "m")
    assert not per_channel_choice(_gemm_model(w), "per-tensor", "m")
    with pytest.raises(CompileError, match="weight_scales must be one of auto, per-channel, per-tensor"):
        per_channel_choice(model, "per-row", "m")


@pytest.mark.parametrize("config", ["banked", "ulx3s"])
@pytest.mark.parametrize("kind", ["conv", "gemm"])
def test_a_banked_scratchpad_requantises_per_channel_through_a_table(tmp_path, kind, config):
    """The table of multipliers and shifts sits at the top of the banked scratchpad's upper half
    (the weights'), below which the weights are planned; the halves stay where the banks are, so
    each output tile is one per-column VMAP instead of one per run of channels."""
    from npu.config import get_config
    from npu.isa import Opcode

    cfg = get_config(config)
    rng = np.random.default_rng(2)
    net, y = _model(kind, rng)
    model = net.model([y])
    shape = net.shapes[net.input]
    calib, x = _inputs(shape, 16, rng), _inputs(shape, 1, rng)
    path = tmp_path / f"{kind}.onnx"
    onnx.save(model, str(path))
    # an int8 output: requantised on the NPU (a float model's output is otherwise int32, for the host)
    cm = compile_onnx(path, config, calib=calib, weight_scales="per-channel", output_precision="int8")
    compare_int8(cm, x)
    prog = cm.lowered.program
    vmaps = [i for i in prog if i.op == Opcode.VMAP]
    assert vmaps and all(i.per_col for i in vmaps), vmaps
    table = min(i.mults for i in vmaps)
    assert cfg.spad_bytes // 2 <= table < cfg.spad_bytes
    loads = [i for i in prog if i.op == Opcode.LOAD and i.spad < cfg.spad_bytes]
    for i in loads:  # nothing but the table's own LOAD reaches it
        end = i.spad + (i.rows - 1) * i.spad_stride + i.cols
        assert end <= table or i.spad == table, (i, table)
    for i in prog:  # the weights stay in the upper half (a bias MATMUL, a_stride 0, reads its block)
        if i.op == Opcode.MATMUL and i.a_stride:
            assert i.b >= cfg.spad_bytes // 2, i
