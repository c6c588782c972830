import numpy as np
import onnx
import pytest

from npu.compiler import compile_onnx
from npu.models import zoo


@pytest.fixture(scope="session")
def demo_models(tmp_path_factory):
    """Perception (with interval points) and planning, compiled for `default`."""
    from npu.driver.demo import build_models

    return build_models("default", cp_interval=20_000, cache=tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="session")
def small_models(tmp_path_factory):
    """A small CNN with interior points carrying live data, and the planning MLP, for `tiny`, with int8
    activations (`small_models_int16`: the same with int16 ones)."""
    return _small_models(tmp_path_factory.mktemp("small"), "tiny", activations="int8")


@pytest.fixture(scope="session")
def small_models_banked(tmp_path_factory):
    """The same two models compiled for the `banked` preset (int8 activations)."""
    return _small_models(tmp_path_factory.mktemp("small_banked"), "banked", activations="int8")


@pytest.fixture(scope="session")
def small_models_int16(tmp_path_factory):
    """The same two models with int16 activations (A16W8), for `tiny`."""
    return _small_models(tmp_path_factory.mktemp("small_int16"), "tiny", activations="int16")


def small_cnn(d):
    """A small CNN (conv, pool, conv, global pool, gemm) saved in folder `d`: its path and calibration."""
    from npu.models.builder import Net

    net = Net("small", (1, 8, 16, 16), seed=3)
    h = net.conv(net.input, 16, 3)
    h = net.conv(net.maxpool(h, 2, 2), 16, 3)
    y = net.gemm(net.flatten(net.gap(h)), 10)
    onnx.save(net.model([y]), str(d / "small.onnx"))
    return d / "small.onnx", np.random.default_rng(0).normal(size=(8, 8, 16, 16)).astype(np.float32)


def _small_models(d, config, **opts):
    from npu.models.builder import Net

    path, calib = small_cnn(d)
    small = compile_onnx(path, config, calib=calib, cp_interval=800, cp_max_live=1 << 20, **opts)
    net = Net("mlp", (1, 32), seed=4)
    y = net.gemm(net.relu(net.gemm(net.input, 32)), 8)
    onnx.save(net.model([y]), str(d / "mlp.onnx"))
    calib_mlp = np.random.default_rng(1).normal(size=(16, 32)).astype(np.float32)
    mlp = compile_onnx(d / "mlp.onnx", config, calib=calib_mlp, **opts)
    xs = np.random.default_rng(2).normal(size=(1, 8, 16, 16)).astype(np.float32)
    xm = np.random.default_rng(3).normal(size=(1, 32)).astype(np.float32)
    return small.to_container(), mlp.to_container(), xs, xm


@pytest.fixture(scope="session")
def mlp_without_points(tmp_path_factory):
    from npu.models.builder import Net

    d = tmp_path_factory.mktemp("nocp")
    net = Net("mlp", (1, 32), seed=4)
    y = net.gemm(net.relu(net.gemm(net.input, 32)), 8)
    onnx.save(net.model([y]), str(d / "mlp.onnx"))
    calib = np.random.default_rng(1).normal(size=(16, 32)).astype(np.float32)
    return compile_onnx(d / "mlp.onnx", "tiny", calib=calib, cancel_points=False).to_container()


@pytest.fixture(scope="session")
def zoo_planning():
    return zoo.planning()
