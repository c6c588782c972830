"""`npu compile` -> .npub -> `npu run`, and the container's error checks."""

import re

import numpy as np
import pytest

from npu.cli import main
from npu.config import get_config
from npu.container import Container, ContainerError
from npu.sim.golden.runner import RunError, run_container
from tests.compiler.test_gemm_mlp import mlp_onnx


@pytest.fixture
def compiled(tmp_path):
    rng = np.random.default_rng(5)
    path = mlp_onnx(
        tmp_path / "m.onnx",
        [rng.normal(0, 0.3, (12, 10)), rng.normal(0, 0.3, (10, 6))],
        [rng.normal(0, 0.1, 10), rng.normal(0, 0.1, 6)],
        4,
    )
    np.save(tmp_path / "calib.npy", rng.normal(0, 1, (32, 12)).astype(np.float32))
    np.save(tmp_path / "x.npy", rng.normal(0, 1, (4, 12)).astype(np.float32))
    return tmp_path, path


def test_compile_and_run_from_the_command_line(compiled, capsys):
    d, path = compiled
    assert (
        main(["compile", str(path), "-o", str(d / "m.npub"), "--calib", str(d / "calib.npy"), "--report"])
        == 0
    )
    out = capsys.readouterr().out
    assert "m.npub" in out and "Gemm" in out
    assert main(["run", str(d / "m.npub"), "--input", str(d / "x.npy"), "--save", str(d / "y.npy")]) == 0
    y = np.load(d / "y.npy")
    # the same as running the compiled model directly
    from npu.compiler import compile_onnx

    cm = compile_onnx(path, calib=np.load(d / "calib.npy"))
    assert np.allclose(y, cm.run(np.load(d / "x.npy"))[0])
    # .npz: the outputs by name, and no temporary file left beside it
    assert main(["run", str(d / "m.npub"), "--input", str(d / "x.npy"), "--save", str(d / "y.npz")]) == 0
    with np.load(d / "y.npz") as z:
        assert z.files == [t.name for t in cm.lowered.outputs] and np.array_equal(z[z.files[0]], y)
    assert not list(d.glob(".*tmp*"))
    capsys.readouterr()
    assert main(["disasm", str(d / "m.npub")]) == 0
    text = capsys.readouterr().out
    # (the Relu between them is a layer of its own with int16 activations: a view)
    assert "layer 0: Gemm gemm0" in text and re.search(r"# layer [12]: Gemm gemm1", text)
    assert "cancellation point 0" in text and text.count("matmul") >= 2


def test_container_errors(compiled):
    d, path = compiled
    from npu.compiler import compile_onnx

    cm = compile_onnx(path, "tiny", calib=np.random.default_rng(0).normal(size=(16, 12)).astype(np.float32))
    blob = cm.to_container().to_bytes()
    c = Container.from_bytes(blob)
    assert c.config_id == get_config("tiny").config_id
    with pytest.raises(ContainerError, match="checksum mismatch"):
        Container.from_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    with pytest.raises(ContainerError, match="truncated"):
        Container.from_bytes(blob[:-5])
    with pytest.raises(ContainerError, match="not an .npub"):
        Container.from_bytes(b"XXXX" + blob[4:])
    with pytest.raises(RunError, match="compiled for configuration id"):
        run_container(c, [np.zeros((4, 12), np.float32)], get_config("default"))
    with pytest.raises(RunError, match="shape"):
        run_container(c, [np.zeros((3, 12), np.float32)], get_config("tiny"))


def test_run_npub_with_output_file(compiled, capsys):
    d, path = compiled
    assert main(["compile", str(path), "-o", str(d / "m.npub"), "--calib", str(d / "calib.npy")]) == 0
    args = [
        "run",
        str(d / "m.npub"),
        "--input",
        str(d / "x.npy"),
        "--output",
        str(d / "y.npy"),
        "--backend",
        "model",
    ]
    assert main(args) == 0
    assert np.load(d / "y.npy").shape == (4, 6)


def test_model_too_large_for_dram(tmp_path):
    """On `tiny` (64 KiB of DRAM) a model whose weights do not fit is refused with the sizes."""
    from npu.compiler import CompileError, compile_onnx
    from tests.compiler.test_gemm_mlp import mlp_onnx

    rng = np.random.default_rng(0)
    path = mlp_onnx(tmp_path / "big.onnx", [rng.normal(size=(256, 300))], [np.zeros(300)], 2)
    with pytest.raises(CompileError, match="more than the 65536 bytes of DRAM"):
        compile_onnx(path, "tiny", calib=rng.normal(size=(8, 256)).astype(np.float32))


def test_run_prints_each_outputs_own_dtype(tmp_path, capsys):
    """An ArgMax after the MLP (run on the host) gives an int64 output: `npu run` says int64, not float."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    path = mlp_onnx(tmp_path / "m.onnx", [rng.normal(0, 0.3, (12, 6))], [rng.normal(0, 0.1, 6)], 4)
    m = onnx.load(str(path))
    logits = m.graph.output[0].name
    m.graph.node.append(helper.make_node("ArgMax", [logits], ["label"], axis=1, keepdims=0))
    m.graph.output.append(helper.make_tensor_value_info("label", TensorProto.INT64, [4]))
    onnx.save(m, str(path))
    np.save(tmp_path / "calib.npy", rng.normal(0, 1, (32, 12)).astype(np.float32))
    np.save(tmp_path / "x.npy", rng.normal(0, 1, (4, 12)).astype(np.float32))
    d = tmp_path
    assert main(["compile", str(path), "-o", str(d / "m.npub"), "--calib", str(d / "calib.npy")]) == 0
    capsys.readouterr()
    assert main(["run", str(d / "m.npub"), "--input", str(d / "x.npy"), "--save", str(d / "y.npy")]) == 0
    out = capsys.readouterr().out
    assert "label: int64 4" in out and re.search(r"\n\S+: float32 4x6", out), out
    assert np.load(tmp_path / "y.1.npy").dtype == np.int64
