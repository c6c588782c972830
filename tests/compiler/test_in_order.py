"""`CompiledModel.run` computes the golden model's values in program order (`InOrderDevice`); the
event-timed model (`run(timed=True)`) must give the same bits on compiled models of every kind:
int8, int16 and mixed activations, host steps between NPU segments, cancellation points, several
configurations."""

from __future__ import annotations

import numpy as np
import pytest

from npu.isa import encode_program, make
from npu.models import zoo
from npu.sim.golden.model import NpuModel
from npu.sim.golden.runner import InOrderDevice, RunError
from tests.compiler.helpers import compile_model


@pytest.mark.parametrize(
    ("name", "config", "activations"),
    [
        ("resnet_small", "default", "auto"),
        ("inception_small", "banked", "int8"),
        ("multipath", "default", "int16"),
        ("digits_cnn", "tiny", "auto"),
        ("planning", "ulx3s", "int8"),
    ],
)
def test_in_order_values_equal_the_timed_model(tmp_path, name, config, activations):
    z = zoo.ZOO[name]()
    cm = compile_model(tmp_path, z.model, config, z.calib, activations=activations)
    batch = z.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value
    x = z.test[:batch]
    for fast, timed in zip(cm.run(x), cm.run(x, timed=True), strict=True):
        assert fast.dtype == timed.dtype and np.array_equal(fast, timed)


def test_in_order_stops_at_an_illegal_instruction_naming_its_pc():
    m = NpuModel("default")
    top = m.cfg.spad_bytes - 8  # a LOAD of 16 bytes there runs past the scratchpad
    prog = [make("load", spad=0, dram=0x1000, rows=1, cols=16), make("load", spad=top, rows=1, cols=16)]
    m.load_program(encode_program(prog), 0)
    with pytest.raises(RunError, match="at pc 1"):
        InOrderDevice(m).run_segment(0)
