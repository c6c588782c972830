"""Steps of a compile in a second process (compiler/parallel.py): the accuracy check's golden-model
runs and the int16 quantisation give the same compiled model as in this process - the check
passed, repaired or refused, the int16 mix taken or not - and a failed child falls back to it."""

import numpy as np
import onnx
import pytest

from npu.compiler import compile as compile_mod
from npu.compiler import compile_onnx, parallel
from npu.compiler.errors import AccuracyError, CompileError, DramTooSmall
from npu.config import get_config
from npu.models import zoo
from tests.compiler.test_accuracy import logmel_model, tones
from tests.compiler.test_precision import _sure_classifier


@pytest.fixture
def always(monkeypatch):
    """Every program and model is worth a second process, on any machine."""
    monkeypatch.setattr(parallel, "MIN_INSTRUCTIONS", 0)
    monkeypatch.setattr(parallel, "MIN_WEIGHT_BYTES", 0)
    monkeypatch.setattr(parallel, "cores", lambda: 2)


def _same(a, b) -> None:
    assert a.qdq.SerializeToString() == b.qdq.SerializeToString()
    assert a.quantisation == b.quantisation
    assert a.program == b.program
    assert a.lowered.dram == b.lowered.dram
    assert a.accuracy.cosines == b.accuracy.cosines and a.accuracy.moved == b.accuracy.moved
    assert [p.pc for p in a.lowered.points] == [p.pc for p in b.lowered.points]


def test_a_passing_check_beside_the_order_search_keeps_the_same_build(tmp_path, always, monkeypatch):
    z = zoo.resnet_small()
    path = tmp_path / "m.onnx"
    onnx.save(z.model, str(path))
    got, result = [], parallel.Child.result
    monkeypatch.setattr(parallel.Child, "result", lambda self: got.append(result(self)) or got[-1])
    lines: list[str] = []
    beside = compile_onnx(path, calib=z.calib, progress=lines.append)
    assert any("in a second process beside the order search" in s for s in lines), lines
    # the int16 quantisation's child was stopped (the choice took int8 tensors), the check's used
    assert "mixed activations: " in beside.quantisation
    assert len(got) == 1 and len(got[0]) == beside.accuracy.samples
    here = compile_onnx(path, calib=z.calib, parallel=False)
    assert beside.accuracy.worst >= 0.99
    _same(beside, here)


def test_the_timed_assembly_takes_the_checks_build_and_the_childs_timing_of_it(tmp_path, always, monkeypatch):
    """The check's build (no points, the ONNX order, which the search keeps here) is the timed
    assembly's first build: taken as it is, with its timing from the child, the same program."""
    z = zoo.resnet_small()
    path = tmp_path / "m.onnx"
    onnx.save(z.model, str(path))
    got, get = [], parallel.SegmentTimes.get
    monkeypatch.setattr(parallel.SegmentTimes, "get", lambda self, k: got.append(get(self, k)) or got[-1])
    beside = compile_onnx(path, calib=z.calib)
    assert beside.lowered.order == sorted(beside.lowered.order)
    assert got and all(isinstance(ends, dict) and ends and cycles > 0 for ends, cycles in got)
    _same(beside, compile_onnx(path, calib=z.calib, parallel=False))


def test_a_child_that_fails_gives_no_segment_times():
    times = parallel.SegmentTimes()
    cfg = get_config("default")
    times.child = parallel.start(parallel.golden_runs, b"not a container", cfg, [], times.path)
    try:
        assert times.get(0) is None and times.child is None
    finally:
        times.close()


def test_a_repair_after_the_check_beside_is_the_same_repair(tmp_path, always, monkeypatch):
    """The first check fails: the build assembled beside it is dropped and the repair rounds run as
    in one process."""
    path = tmp_path / "logmel.onnx"
    onnx.save(logmel_model(), str(path))
    calib = tones(16, seed=0)
    got, result = [], parallel.Child.result
    monkeypatch.setattr(parallel.Child, "result", lambda self: got.append(result(self)) or got[-1])
    beside = compile_onnx(path, calib=calib)
    assert beside.accuracy.moved  # repaired
    assert got and got[0] is not None  # the first check's outputs came from the child
    _same(beside, compile_onnx(path, calib=calib, parallel=False))
    with pytest.raises(AccuracyError, match="reaches cosine"):
        compile_onnx(path, calib=calib, target_cosine=0.99999999)


def test_an_error_of_the_build_beside_the_check_is_raised_as_without_it(tmp_path, always, monkeypatch):
    """The speculative build's error (here the DRAM too small for the ordered build) comes out of a
    check that passes, as the same build's error does after the check in one process."""
    z = zoo.resnet_small()
    path = tmp_path / "m.onnx"
    onnx.save(z.model, str(path))
    assembled = compile_mod._assembled

    def timed_fails(*a, timed: bool = True, reuse=None):
        if timed:
            raise DramTooSmall("the ordered build does not fit (test)")
        return assembled(*a, timed=False, reuse=reuse)

    monkeypatch.setattr(compile_mod, "_assembled", timed_fails)
    errors = []
    for on in (True, False):
        with pytest.raises(CompileError) as e:
            compile_onnx(path, calib=z.calib, parallel=on)
        errors.append((type(e.value), str(e.value)))
    assert errors[0] == errors[1] and "ordered build does not fit" in errors[0][1], errors


@pytest.mark.parametrize("python", ["/bin/false", "/no/such/python"])
def test_a_child_that_fails_or_cannot_start_leaves_the_check_here(tmp_path, always, monkeypatch, python):
    z = zoo.resnet_small()
    path = tmp_path / "m.onnx"
    onnx.save(z.model, str(path))
    here = compile_onnx(path, calib=z.calib, parallel=False)
    monkeypatch.setattr(parallel.sys, "executable", python)
    _same(compile_onnx(path, calib=z.calib), here)


def test_the_int16_quantisation_beside_the_choice_is_the_one_taken(tmp_path, always, monkeypatch):
    """A model whose calibration outputs do not respond to int8 noise keeps int16 everywhere: the
    quantisation the child made is taken, the same as one made here."""
    _sure_classifier(tmp_path / "s.onnx")
    calib = np.random.default_rng(0).normal(size=(16, 8, 12, 12)).astype(np.float32)
    got, result = [], parallel.Child.result
    monkeypatch.setattr(parallel.Child, "result", lambda self: got.append(result(self)) or got[-1])
    lines: list[str] = []
    beside = compile_onnx(tmp_path / "s.onnx", calib=calib, progress=lines.append)
    assert any("the int16 quantisation in a second process" in s for s in lines), lines
    assert "do not respond to int8 noise" in beside.quantisation
    assert isinstance(got[0], onnx.ModelProto)  # the child's quantisation came back and was taken
    _same(beside, compile_onnx(tmp_path / "s.onnx", calib=calib, parallel=False))


@pytest.mark.parametrize("python", ["/bin/false", None])
def test_an_int16_quantisation_that_fails_or_cannot_start_is_made_here(tmp_path, always, monkeypatch, python):
    """A child that fails, or calibration data that do not pickle (an open `.npz`), leave the int16
    quantisation to this process: the same model."""
    _sure_classifier(tmp_path / "s.onnx")
    x = np.random.default_rng(0).normal(size=(16, 8, 12, 12)).astype(np.float32)
    name = onnx.load(str(tmp_path / "s.onnx")).graph.input[0].name
    np.savez(tmp_path / "c.npz", **{name: x})
    here = compile_onnx(tmp_path / "s.onnx", calib={name: x}, activations="mixed", accuracy_check=False,
                        parallel=False)  # fmt: skip
    if python:
        monkeypatch.setattr(parallel.sys, "executable", python)
    with np.load(tmp_path / "c.npz") as calib:  # an NpzFile: a Mapping holding an open file
        beside = compile_onnx(tmp_path / "s.onnx", calib=calib, activations="mixed", accuracy_check=False)
    assert "do not respond to int8 noise" in beside.quantisation
    assert beside.qdq.SerializeToString() == here.qdq.SerializeToString()
    assert beside.program == here.program
