import onnx
import pytest

from npu.compiler import compile_onnx
from npu.models import zoo

#: the ImageNet-class zoo models' compile is shared by tests/compiler/test_zoo.py (accuracy) and
#: test_arena.py (the DRAM plan): their tests are in this xdist group, so one worker compiles each once
IMAGENET_GROUP = pytest.mark.xdist_group("imagenet-compile")


@pytest.fixture(scope="session")
def imagenet_int8(tmp_path_factory):
    """compiled(name) -> (CompiledModel, ZooModel): zoo.IMAGENET[name] compiled for `default` with
    int8 activations (the other options default), once per test worker."""
    d = tmp_path_factory.mktemp("imagenet")
    cache: dict = {}

    def compiled(name: str):
        if name not in cache:
            z = zoo.IMAGENET[name]()
            onnx.save(z.model, str(d / f"{name}.onnx"))
            cache[name] = (compile_onnx(d / f"{name}.onnx", "default", calib=z.calib, activations="int8"), z)
        return cache[name]

    return compiled
