"""Consecutive operators alternate between the bottom and the top of the on-chip memories, so that
one's loads and MATMULs can run under the other's passes; a requantisation table kept at the top of
the scratchpad must not pin both to the same buffers."""

import numpy as np
import onnx
from onnx import TensorProto, helper

from npu.compiler.lower import lower
from npu.config import ACC_BASE
from npu.isa import footprint

from .helpers import compare_int8, compile_model


def _chain(seed: int = 3) -> onnx.ModelProto:
    """Three 1 x 1 convolutions whose output channels differ in scale (per-channel weights: each
    takes a requantisation table)."""
    rng = np.random.default_rng(seed)
    chans = [16, 32, 32, 16]
    nodes, inits = [], []
    x = "x"
    for i, (ci, co) in enumerate(zip(chans, chans[1:], strict=False)):
        w = rng.normal(size=(co, ci, 1, 1)) * rng.uniform(0.05, 2.0, size=(co, 1, 1, 1))
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, w.shape, w.astype(np.float32).ravel()))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        x = f"r{i}"
    g = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 16, 12, 12])], inits,
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _spad_spans(items) -> list[tuple[int, int]]:
    out = []
    for it in items:
        if it.kind == "instr":
            r, w = footprint(it.instr)
            out += [(s.start, s.end) for s in r + w if s.space == "onchip" and s.start < ACC_BASE]
    return out


def test_operators_with_tables_alternate_and_stay_bit_exact(tmp_path):
    rng = np.random.default_rng(0)
    calib = rng.normal(size=(4, 1, 16, 12, 12)).astype(np.float32)
    cm = compile_model(tmp_path, _chain(), "default", calib[:, 0], weight_scales="per-channel")
    compare_int8(cm, calib[0])
    low = lower(cm.qdq, cm.cfg)
    frags = [f for f in low.frags if f.kind == "npu"]
    tables = [f for f in frags if any(s[1] == cm.cfg.spad_bytes for s in _spad_spans(f.items))]
    assert len(tables) >= 2, "the chain's convolutions keep their tables at the scratchpad's top"
    for a, b in zip(frags, frags[1:], strict=False):
        lo, hi = _spad_spans(a.placed(False, cm.cfg)), _spad_spans(b.placed(True, cm.cfg))
        assert not any(s < d and c < e for s, e in lo for c, d in hi), (a.layer.node, b.layer.node)
