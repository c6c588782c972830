"""The MLPerf Tiny reference architectures of the zoo (seeded weights) through the compiler with its
default options: every convolution and dense layer on the NPU, outputs within cosine 0.99 of
onnxruntime float on every held-out input; on the iCEBreaker's 64 KiB of DRAM they do not fit, and
the compiler says so with the sizes."""

import onnx
import pytest

from npu.compiler import compile_onnx
from npu.compiler.errors import CompileError
from npu.models import zoo
from tests.compiler.helpers import cosine, ort_outputs

#: MobileNetV1-0.25 at 96x96 compiles in about 35 s: in `make test-all`
CASES = [
    "ds_cnn_kws",
    "resnet8",
    "fc_autoencoder",
    pytest.param("mobilenet_v1_025_vww", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name", CASES)
def test_tinyml_models_match_onnxruntime_float_on_the_ulx3s(tmp_path, name):
    z = zoo.TINYML[name]()
    path = tmp_path / f"{name}.onnx"
    onnx.save(z.model, str(path))
    cm = compile_onnx(path, "ulx3s", calib=z.calib)
    assert all(la.placement == "npu" for la in cm.lowered.layers if la.op in ("Conv", "Gemm")), [
        (la.op, la.placement) for la in cm.lowered.layers
    ]
    assert cm.placement.macs_host == 0
    for i in range(len(z.test)):
        got, want = cm.run(z.test[i : i + 1]), ort_outputs(z.model, z.test[i : i + 1])
        for g, w in zip(got, want, strict=True):
            assert cosine(g, w) >= 0.99, (name, i)


def test_tinyml_models_that_do_not_fit_the_icebreaker_are_refused_with_their_sizes(tmp_path):
    z = zoo.ds_cnn_kws()
    path = tmp_path / "kws.onnx"
    onnx.save(z.model, str(path))
    with pytest.raises(CompileError, match=r"more than the 65536 bytes of DRAM on icebreaker: .* of program"):
        compile_onnx(path, "icebreaker", calib=z.calib, activations="int8")
