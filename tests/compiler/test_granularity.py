"""`--granularity operator`: every operator its own segment, DRAM in and DRAM out, with the operator
graph; the same results as the default granularity. `--granularity step`: long operators also cut
between their steps into chained segments that continue on each other's on-chip data."""

import onnx
import pytest

from npu.compiler import CompileError, compile_onnx
from npu.container import Container, HostStep, NpuSegment
from npu.models import zoo
from tests.compiler.helpers import assert_same_int8


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    d = tmp_path_factory.mktemp("gran")
    z = zoo.inception_small()
    onnx.save(z.model, str(d / "m.onnx"))
    seg = compile_onnx(d / "m.onnx", "default", calib=z.calib)
    op = compile_onnx(d / "m.onnx", "default", calib=z.calib, granularity="operator")
    return seg, op, z.test[:1]


def test_one_segment_per_operator_with_its_producers(both):
    seg, op, _ = both
    man = Container.from_bytes(op.to_container().to_bytes()).manifest
    assert man.granularity == "operator"
    npu_layers = [la for la in man.layers if la.placement == "npu"]
    npu_segs = [s for s in man.segments if isinstance(s, NpuSegment)]
    assert len(npu_segs) == len(npu_layers) > len([s for s in seg.lowered.segments if s.kind == "npu"])
    for s in npu_segs:  # exactly one operator in each segment, with the cost model's runtime
        assert sum(s.pc <= la.pc[0] < s.end for la in npu_layers) == 1
        assert s.est_cycles and s.est_cycles > 0
    deps = man.segment_deps()
    for i, d in enumerate(deps):
        assert all(k < i for k in d)  # producers come first in program order
    # the branches of an inception block read the same producer: the graph is not a chain
    assert any(len(d) > 1 for d in deps) or any(deps.count(d) > 1 for d in deps if d)
    assert sum(not d for d in deps) == 1  # only the first operator reads the model input alone


def test_results_equal_the_default_granularity(both):
    seg, op, x = both
    assert_same_int8(seg, op, x)


def test_default_granularity_keeps_the_chain_and_old_files_read_as_chains(both):
    seg, _, _ = both
    man = seg.to_container().manifest
    assert man.granularity == "segment"
    assert man.segment_deps() == [[i - 1] if i else [] for i in range(len(man.segments))]
    assert all(isinstance(s, NpuSegment | HostStep) for s in man.segments)


def test_an_unknown_granularity_is_refused(tmp_path):
    z = zoo.planning()
    onnx.save(z.model, str(tmp_path / "p.onnx"))
    with pytest.raises(CompileError, match="granularity must be one of segment, operator, step, not 'layer'"):
        compile_onnx(tmp_path / "p.onnx", "default", calib=z.calib, granularity="layer")


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    d = tmp_path_factory.mktemp("step")
    z = zoo.resnet_small()
    onnx.save(z.model, str(d / "m.onnx"))
    op = compile_onnx(d / "m.onnx", "default", calib=z.calib, granularity="operator")
    st = compile_onnx(d / "m.onnx", "default", calib=z.calib, granularity="step", step_cycles=5000)
    return op, st, z.test[:1]


def test_step_cuts_long_operators_into_chained_segments(stepped):
    op, st, _ = stepped
    man = Container.from_bytes(st.to_container().to_bytes()).manifest
    assert man.granularity == "step"
    segs = [s for s in man.segments if isinstance(s, NpuSegment)]
    chained = [i for i, s in enumerate(man.segments) if isinstance(s, NpuSegment) and s.chained]
    assert len(segs) > len([s for s in op.lowered.segments if s.kind == "npu"]) and chained
    deps = man.segment_deps()
    for i in chained:
        assert deps[i] == [i - 1]  # a chained segment follows the one it continues, nothing else
    npu_layers = [la for la in man.layers if la.placement == "npu"]
    for la in npu_layers:  # every segment belongs to exactly one layer, whose pc range covers it
        assert sum(la.pc[0] <= s.pc < la.pc[1] for s in segs) >= 1
    for s in segs:
        assert sum(la.pc[0] <= s.pc < la.pc[1] for la in npu_layers) == 1
        if not s.chained:
            continue
        # the cost model's runtime of a cut: at most the limit, unless one step alone exceeds it
        assert s.est_cycles <= 5000 or s.compute_cycles > 2500, s
    # the point ending a segment that the next one continues records the on-chip data it leaves
    ends = {p.pc: p for p in man.cancel_points}
    for i in chained:
        prev = man.segments[i - 1]
        point = ends.get(prev.end - 1)
        assert point is not None and point.live_bytes > 0, (i, prev)


def test_step_results_equal_the_operator_granularity(stepped):
    op, st, x = stepped
    assert_same_int8(op, st, x)


def test_the_runtime_refuses_chained_segments(stepped):
    from npu.driver.runtime import DriverError, Npu

    _, st, x = stepped
    npu = Npu("model", "default")
    m = npu.load(st.to_container(), "resnet_small")
    with pytest.raises(DriverError, match="granularity 'step'.*layer-wise scheduler"):
        m.submit(x)
