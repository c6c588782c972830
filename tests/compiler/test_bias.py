"""A convolution's bias as a MATMUL of int8 digits (compiler/bias.py) instead of a LOAD repeated for
every pixel: exact digits, the planner's choice, and the same int8 results as the LOAD."""

import numpy as np
import pytest

from npu.arith import cdiv
from npu.compiler import bias as biasmm
from npu.compiler import spatial
from npu.config import get_config
from npu.isa import Opcode
from npu.models.builder import Net
from npu.timing import duration
from tests.compiler.helpers import assert_pauses_bit_exact, assert_same_int8, compare_int8, compile_model
from tests.compiler.test_operators import calib_for


@pytest.mark.parametrize("limit", [1, 200, 16384, 40_000, 1 << 22, 24_000_000])
def test_digits_rebuild_every_bias_exactly(limit):
    rng = np.random.default_rng(limit)
    v = np.concatenate([rng.integers(-limit, limit + 1, 500), [0, limit, -limit, 16383, -16384]])
    d = biasmm.digits(v)
    assert d is not None and d.dtype == np.int8
    assert d.shape[1] >= 2 and d.shape[1] <= biasmm.DIGITS
    assert (d.astype(np.int64) @ np.array(biasmm.BASE[: d.shape[1]]) == v).all()


@pytest.mark.parametrize(
    "v, k",
    [(0, 2), (16384, 2), (32639, 2), (-32896, 2), (32640, 3), (127 * 32768 + 20000, 3),
     (127 * 32768 + 32639, 3), (127 * 32768 + 32640, 4), (25_001_855, 8), (-25_002_112, 8)],
)  # fmt: skip
def test_digits_are_the_fewest(v, k):
    """The first two digits reach -32896..32639, each further one 127 multiples of 32768: the
    fewest digits a value needs."""
    d = biasmm.digits(np.array([v]))
    assert d is not None and d.shape[1] == k
    assert int(d[0].astype(np.int64) @ np.array(biasmm.BASE[:k])) == v


def test_digits_refuse_a_bias_beyond_their_range():
    for v in (25_001_856, -25_002_113, 2**31 - 1, -(2**31)):
        assert biasmm.digits(np.array([0, v])) is None


def _bias_ops(cm):
    prog = cm.lowered.program
    f = [(i, i.fields) for i in prog]
    mm = [i for i, x in f if i.op == Opcode.MATMUL and not x["a_stride"] and not x["accumulate"]]
    loads = [i for i in prog if i.op == Opcode.LOAD and i.fields["dram_stride"] == 0 and i.fields["rows"] > 1]
    return mm, loads


def _est(cm) -> int:
    return sum(la.est_cycles for la in cm.lowered.layers if la.placement == "npu")


@pytest.mark.parametrize("config", ["tiny", "default", "banked", "ulx3s"])
@pytest.mark.parametrize(
    "spec", [(32, 64, 1, 0, 1), (16, 16, 3, 1, 16), (12, 24, 3, 1, 3)], ids=["1x1", "dw", "grouped"]
)
def test_bias_matmul_gives_the_loads_results(tmp_path, config, spec, monkeypatch):
    """Every convolution kind, the bias as a MATMUL (taken wherever it fits: its cost counted as
    nothing) against the same convolution with it as a LOAD: the same int8 results, bit for bit."""
    cin, cout, k, pad, groups = spec
    net = Net("bias", (1, cin, 8, 8), seed=3)
    model = net.model([net.conv(net.input, cout, k, pad=pad, groups=groups, relu=False)])
    calib = calib_for(net.shapes[net.input])
    x = np.random.default_rng(5).normal(0, 1, net.shapes[net.input]).astype(np.float32)
    with monkeypatch.context() as mp:
        mp.setattr(spatial, "_bias_matmul_cycles", lambda *_a: 0)
        cm = compile_model(tmp_path, model, config, calib, name="mm")
    mm, loads = _bias_ops(cm)
    assert mm and not loads
    compare_int8(cm, x)
    cfg = get_config(config)
    if cfg.spad_banked:  # the A row among the activations, the digits among the weights: other banks
        half = cfg.spad_bytes // 2
        assert all(i.fields["a"] < half <= i.fields["b"] for i in mm), mm
        if cfg.clusters == 1:  # (several clusters read the one A row from one bank a step)
            steps = [cdiv(i.fields["m"], cfg.clusters) * cdiv(i.fields["n"], cfg.pes_per_cluster) for i in mm]
            assert [duration(i, cfg) for i in mm] == [cfg.matrix_latency + s for s in steps]  # a step a cycle
    monkeypatch.setattr(biasmm, "digits", lambda _b: None)  # digits refused: the LOAD
    cl = compile_model(tmp_path, model, config, calib, name="load")
    mm2, loads2 = _bias_ops(cl)
    assert loads2 and not mm2
    assert_same_int8(cm, cl, x)


def test_planner_takes_the_matmul_and_the_estimate_falls(tmp_path, monkeypatch):
    """A 1 x 1 convolution of few input channels: its MATMULs are short and the bias LOAD (4 bytes
    an output element) would be most of its DMA; the planner takes the MATMUL, and the cost
    model's estimate is below the same convolution's with the LOAD."""
    net = Net("bias", (1, 8, 16, 16), seed=3)
    model = net.model([net.conv(net.input, 64, 1, pad=0, relu=False)])
    calib = calib_for(net.shapes[net.input])
    cm = compile_model(tmp_path, model, "default", calib, name="mm")
    mm, loads = _bias_ops(cm)
    assert mm and not loads
    compare_int8(cm, np.random.default_rng(5).normal(0, 1, net.shapes[net.input]).astype(np.float32))
    monkeypatch.setattr(biasmm, "digits", lambda _b: None)
    cl = compile_model(tmp_path, model, "default", calib, name="load")
    assert _est(cm) < _est(cl)


@pytest.mark.parametrize("config", ["default", "banked"])
def test_int16_convolution_with_a_large_bias(tmp_path, monkeypatch, config):
    """int16 activations make the accumulator's bias large (small input scales): more digits (on
    `banked` an int16 A at half rate: more than lanes / 2 digits take two k steps), the same results
    as onnxruntime's QDQ model."""
    net = Net("bias16", (1, 16, 10, 10), seed=4)
    y = net.conv(net.input, 24, 3, pad=1, relu=False, bias=np.random.default_rng(7).normal(0, 8.0, 24))
    model = net.model([y])
    monkeypatch.setattr(spatial, "_bias_matmul_cycles", lambda *_a: 0)
    cm = compile_model(tmp_path, model, config, calib_for(net.shapes[net.input]), activations="int16")
    x = np.random.default_rng(6).normal(0, 1, net.shapes[net.input]).astype(np.float32)
    compare_int8(cm, x)
    mm, _ = _bias_ops(cm)
    assert mm and max(i.fields["k"] for i in mm) > 2


def test_one_input_band_is_loaded_once_for_every_output_tile(tmp_path):
    """A 1 x 1 convolution whose output channels split into tiles (the accumulators hold a quarter
    of them) over one band: the band is loaded once, and the program still pauses and resumes at
    its points to the same results (the band is live there, dumped and restored)."""
    net = Net("band", (1, 32, 2, 96), seed=9)
    model = net.model([net.conv(net.input, 200, 1, pad=0, relu=False)])
    calib = calib_for(net.shapes[net.input])
    x = np.random.default_rng(2).normal(0, 1, net.shapes[net.input]).astype(np.float32)
    cm = compile_model(tmp_path, model, "default", calib, name="band", activations="int16")
    (layer,) = cm.lowered.layers
    assert "out-channel" in layer.split
    bands = [i for i in cm.lowered.program if i.op == Opcode.LOAD and i.fields["cols"] == 96 * 32 * 2]
    assert len(bands) == 1, len(bands)
    compare_int8(cm, x)
    # paused at every cancellation point (the band live at those between tiles), an urgent model
    # run, resumed: the same bits
    low = compile_model(tmp_path, model, "default", calib, name="pts", activations="int16", cp_interval=1500)
    assert sum(i.op == Opcode.LOAD and i.fields["cols"] == 96 * 32 * 2 for i in low.lowered.program) == 1
    assert len(low.lowered.points) > 3
    assert_pauses_bit_exact(low, cm, x)


def _gemm_model(m: int, k: int, n: int):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(m + n)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (n, k)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 2.0, n).astype(np.float32), "b")]  # fmt: skip
    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, name="fc")
    g = helper.make_graph([node], "fc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], inits)  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(("op", "config"), [("gemm", "default"), ("gemm", "tiny"), ("deconv", "default")])
def test_gemm_bias_matmul_gives_the_loads_results(tmp_path, monkeypatch, op, config):
    """A GEMM of many rows (a linear layer over 64 vectors; a transposed convolution's rows) starts
    its accumulators as the bias by one MATMUL of a resident block where that takes at most half
    the LOAD's cycles: the same results as with the LOAD, bit for bit, and fewer cycles."""
    from tests.compiler.test_convtranspose import deconv_model

    if op == "gemm":
        model, shape = _gemm_model(64, 48, 40), (64, 48)
    else:
        model, shape = deconv_model(2, 2, cout=12, shape=(1, 6, 6, 16)), (1, 6, 6, 16)
    calib = np.random.default_rng(1).normal(0, 1, (8, *shape[1:])).astype(np.float32)
    calib = calib if op == "deconv" else np.random.default_rng(1).normal(0, 1, shape).astype(np.float32)
    x = np.random.default_rng(2).normal(0, 1, shape).astype(np.float32)
    cm = compile_model(tmp_path, model, config, calib, name="mm", accuracy_check=False)
    mm, loads = _bias_ops(cm)
    compare_int8(cm, x)
    monkeypatch.setattr(biasmm, "digits", lambda _b: None)
    cl = compile_model(tmp_path, model, config, calib, name="load", accuracy_check=False)
    mm2, loads2 = _bias_ops(cl)
    assert loads2 and not mm2
    assert_same_int8(cm, cl, x)
    if config == "tiny":  # a narrow array: the MATMUL's k steps cost more than the LOAD saves
        assert loads and not mm
        return
    assert mm and _est(cm) < _est(cl), (_est(cm), _est(cl))
