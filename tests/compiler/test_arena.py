"""DRAM planning (compiler/dram.py): activations share one arena by liveness. Two tensors whose
lifetimes intersect (in the chosen order; over the operator graph's partial order with
`granularity="operator"`) never share bytes, the programs compute the same bits as with one range
per tensor (DRAM full of stale data, random orders of independent operators, preemption at every
cancellation point), the arena stays close to its lower bound on the ImageNet-class zoo models, and
the order search's memory objective lowers that bound."""

from __future__ import annotations

import bisect
import random
import time

import numpy as np
import onnx
import pytest

from npu.cli import main
from npu.compiler import CompileError, compile_onnx
from npu.compiler.assemble import assemble
from npu.compiler.cleanup import cleanup
from npu.compiler.dram import LiveMemory
from npu.compiler.lower import lower
from npu.compiler.order import search_order, subgraphs, topo_orders
from npu.compiler.quantize import quantize_float_model
from npu.config import get_config
from npu.container import HostStep, TensorDesc
from npu.driver import Npu
from npu.driver.bench import preempt_at_every_point
from npu.executor import HostSteps, check_inputs, read_outputs, write_inputs
from npu.isa import Opcode, footprint
from npu.models import zoo
from npu.models.builder import Net
from npu.sim.golden.model import NpuModel
from npu.sim.golden.runner import ModelDevice, run_container
from tests.compiler.conftest import IMAGENET_GROUP
from tests.compiler.helpers import compare_int8

CFG = get_config("default")


def _moves(i) -> bool:
    """Whether a LOAD or STORE moves DRAM bytes (one of only padding reads none: its address is
    not a tensor's, and the DRAM plan leaves it)."""
    return i.fields["rows"] > 0 and i.fields["cols"] > 0


def mixed() -> zoo.ZooModel:
    """A host step (LRN) in the middle, a concatenation with channel gaps (5 + 8 + 3 channels), a
    residual Add, a graph output that later operators also read, and a host Softmax at the end."""
    net = Net("mixed", (1, 6, 12, 12), seed=21)
    a = net.conv(net.input, 16, 3)
    b = net.lrn(a)
    cat = net.concat(
        [net.conv(b, 5, 1), net.conv(net.conv(b, 8, 1), 8, 3), net.conv(net.maxpool(a, 3, 1, 1), 3, 1)]
    )
    y = net.add(net.conv(cat, 12, 3, relu=False), net.conv(a, 12, 1, relu=False))
    logits = net.gemm(net.flatten(net.gap(y)), 10)
    rng = np.random.default_rng(21)
    calib = rng.normal(size=(8, 6, 12, 12)).astype(np.float32)
    test = rng.normal(size=(2, 6, 12, 12)).astype(np.float32)
    return zoo.ZooModel("mixed", net.model([net.softmax(logits), cat]), calib, test)


def wide_branch() -> zoo.ZooModel:
    """Three branches, the last (in ONNX order) through a wide 64-channel tensor: running it first,
    before the other two branches' outputs exist, keeps fewer bytes live."""
    net = Net("wide_branch", (1, 8, 16, 16), seed=41)
    x = net.conv(net.input, 8, 3)
    b, c = net.conv(x, 16, 1), net.conv(x, 16, 1)
    a = net.conv(net.conv(x, 64, 3), 16, 1)
    y = net.conv(net.concat([b, c, a]), 8, 1)
    rng = np.random.default_rng(41)
    calib = rng.normal(size=(8, 8, 16, 16)).astype(np.float32)
    return zoo.ZooModel(
        "wide_branch", net.model([y]), calib, rng.normal(size=(1, 8, 16, 16)).astype(np.float32)
    )


MODELS = {**zoo.ZOO, **zoo.IMAGENET, "mixed": mixed, "wide_branch": wide_branch}


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(name, **compile_onnx options) -> (CompiledModel, ZooModel), cached per module."""
    d = tmp_path_factory.mktemp("arena")
    zoos: dict = {}
    cache: dict = {}

    def build_(name: str, **kw):
        key = (name, tuple(sorted(kw.items())))
        if key not in cache:
            if name not in zoos:
                zoos[name] = MODELS[name]()
                onnx.save(zoos[name].model, str(d / f"{name}.onnx"))
            z = zoos[name]
            # int8: the host's Softmax reads exact int32 logits, equal to onnxruntime's within 1e-5
            # only when its float32 Gemm sums int8 products (int16 ones lose bits to its rounding)
            kw = {"activations": "int8", **kw}
            cache[key] = (compile_onnx(d / f"{name}.onnx", CFG, calib=z.calib, **kw), z)
        return cache[key]

    return build_


def _lowering(z: zoo.ZooModel):
    return lower(quantize_float_model(cleanup(z.model), z.calib, z.name), CFG, z.name)


# -- (a) no two live tensors share bytes ------------------------------------------------------------


def _accessors(low) -> dict[int, set]:
    """Activation range (index into low.buffers) -> the operators touching it, "in" (the host writes
    the graph inputs first) and "out" (it reads the outputs last): from every LOAD/STORE footprint,
    host step and tensor description, independently of the planner's own bookkeeping."""
    starts = [b.addr for b in low.buffers]

    def which(addr: int, end: int) -> int:
        i = bisect.bisect_right(starts, addr) - 1
        assert i >= 0 and end <= starts[i] + low.buffers[i].size, (
            f"access [{addr:#x}, {end:#x}) crosses ranges"
        )
        return i

    users: dict[int, set] = {i: set() for i, b in enumerate(low.buffers) if b.kind == "act"}
    for f in low.frags:
        if f.kind == "npu":
            for it in f.items:
                if it.kind == "instr":
                    for s in sum(footprint(it.instr), []):
                        if s.space == "dram" and s.end > s.start:
                            i = which(s.start, s.end)
                            if i in users:
                                users[i].add(f.index)
        elif f.kind == "host":
            for io in f.host.inputs + f.host.quantize:
                if io.tensor is not None:
                    users[which(io.tensor.addr, io.tensor.addr + io.tensor.layout.nbytes)].add(f.index)
    for t in low.inputs:
        users[which(t.addr, t.addr + 1)].add("in")
    for t in low.outputs:
        if isinstance(t, TensorDesc):
            users[which(t.addr, t.addr + 1)].add("out")
    return users


def _ancestors(low) -> dict:
    anc: dict = {"in": set(), "out": set(range(len(low.frags))) | {"in"}}
    for f in low.frags:
        anc[f.index] = {"in"}.union(*({d} | anc[d] for d in f.deps))
    return anc


def check_no_overlap(low, out, granularity: str) -> int:
    """Every pair of activations that may be live at once has disjoint final ranges; the program's
    LOADs and STOREs are the operators' own, moved to their tensors' planned addresses. Returns the
    number of pairs that do share bytes (reuse happened)."""
    users = _accessors(low)
    plan = out.dram_plan
    size = {i: low.buffers[i].size for i in users}
    at = {i: plan.addrs[i] for i in users}
    pos = {f: k for k, f in enumerate(out.order)} | {"in": -1, "out": len(out.order)}
    anc = _ancestors(low)

    def ordered(a: set, b: set) -> bool:  # every access of a before every access of b
        if granularity == "operator":
            return all(x in anc[y] for x in a for y in b)
        return max(pos[x] for x in a) < min(pos[y] for y in b)

    shared = 0
    ids = sorted(users)
    for k, a in enumerate(ids):
        for b in ids[k + 1 :]:
            overlap = at[a] < at[b] + size[b] and at[b] < at[a] + size[a]
            if overlap:
                assert ordered(users[a], users[b]) or ordered(users[b], users[a]), (
                    f"{low.buffers[a].what} and {low.buffers[b].what} are live together at "
                    f"overlapping addresses [{at[a]:#x}, +{size[a]}) and [{at[b]:#x}, +{size[b]})"
                )
                shared += 1
    # constants below the arena, all of it below the program
    consts = [(plan.addrs[i], b.size) for i, b in enumerate(low.buffers) if b.kind == "const"]
    assert all(a + n <= plan.arena_base for a, n in consts)
    assert all(plan.arena_base <= at[i] and at[i] + size[i] <= plan.dram_end for i in ids)
    # the assembled program: each operator's DRAM accesses, moved by its tensors' displacement
    starts = [b.addr for b in low.buffers]
    for la, f in zip(out.layers, (low.frags[i] for i in out.order), strict=True):
        if f.kind != "npu":
            continue
        want = []
        for it in f.items:
            if it.kind == "instr" and it.instr.op in (Opcode.LOAD, Opcode.STORE) and _moves(it.instr):
                v = it.instr.fields["dram"]
                i = bisect.bisect_right(starts, v) - 1
                want.append((it.instr.op, v - low.buffers[i].addr + plan.addrs[i]))
        got = [
            (i.op, i.fields["dram"])
            for i in out.program[la.pc[0] : la.pc[1]]
            if i.op in (Opcode.LOAD, Opcode.STORE) and _moves(i)
        ]
        # the same accesses; their order is the one they can start in (npu.program.start_order)
        assert sorted(got) == sorted(want), la.node
    return shared


@pytest.mark.parametrize(
    "name, granularity",
    [
        ("inception_small", "segment"),
        ("inception_small", "operator"),
        ("resnet_small", "segment"),
        ("perception", "segment"),
        ("mixed", "segment"),
        ("mixed", "operator"),
        ("squeezenet_like", "segment"),
        ("squeezenet_like", "operator"),
    ],
)
def test_live_tensors_never_share_bytes(name, granularity):
    z = MODELS[name]()
    low = _lowering(z)
    order = search_order(low, budget_s=None, exhaustive_limit=24, samples=8).order
    out = assemble(low, order, granularity=granularity)
    shared = check_no_overlap(low, out, granularity)
    p = out.dram_plan
    print(f"\n{name} ({granularity}): {shared} pairs share bytes; arena {p.arena_bytes}, bump {p.bump_bytes}")
    assert shared > 0 and p.arena_bytes < p.bump_bytes
    assert p.lower_bound <= p.arena_bytes and p.dram_end == out.dram_end


# -- (b) the same bits ----------------------------------------------------------------------------


def _stale_dram_run(cm, x) -> list[np.ndarray]:
    """Run with every DRAM byte random before the model is loaded: nothing may rely on fresh zeros."""
    m = NpuModel(cm.cfg)
    m.dram[:] = np.random.default_rng(7).integers(0, 256, m.dram.size, dtype=np.uint8)
    return run_container(cm.to_container(), [x], cm.cfg, model=m, int8=True)[0]


def _random_topological_run(cm, x, seed: int) -> list[np.ndarray]:
    """Run the segments in a random order their dependencies allow (what the driver may do with
    `granularity="operator"` on several engines), DRAM starting stale."""
    c = cm.to_container()
    man = c.manifest
    m = NpuModel(cm.cfg)
    m.dram[:] = np.random.default_rng(seed).integers(0, 256, m.dram.size, dtype=np.uint8)
    for d in man.dram:
        m.write_dram(d.addr, c.blobs[d.blob])
    m.load_program(c.blobs["program"], man.program.base)
    dev, env = ModelDevice(m), {}
    write_inputs(man, dev, check_inputs(man, [x]), env)
    host, deps, done = HostSteps(c.blobs, man.segments), man.segment_deps(), set()
    rng = random.Random(seed)
    while len(done) < len(man.segments):
        i = rng.choice([i for i in range(len(man.segments)) if i not in done and set(deps[i]) <= done])
        seg = man.segments[i]
        if isinstance(seg, HostStep):
            host.run(dev, seg, env)
        else:
            dev.run_segment(seg.pc)
        done.add(i)
    return read_outputs(man, dev, env, int8=True)


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", ["inception_small", "resnet_small", "perception", "mixed"])
@pytest.mark.parametrize("granularity", ["segment", "operator"])
def test_arena_gives_the_same_bits_as_one_range_per_tensor(build, name, granularity):
    arena, z = build(name, order="default", granularity=granularity, dram_plan="arena")
    bump, _ = build(name, order="default", granularity=granularity, dram_plan="bump")
    x = z.test[: z.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value]
    assert arena.dram_plan.arena_bytes < bump.dram_plan.arena_bytes == bump.dram_plan.bump_bytes
    assert arena.lowered.dram_end < bump.lowered.dram_end
    want = bump.run_int8(x)
    assert _same(arena.run_int8(x), want)
    assert _same(_stale_dram_run(arena, x), want)
    if granularity == "operator":
        for seed in range(3):
            assert _same(_random_topological_run(arena, x, seed), want), seed
    if name in ("inception_small", "mixed"):  # and within onnxruntime's tolerance
        compare_int8(arena, x)


def test_operator_graph_on_two_engines_with_two_instances(build):
    """Independent operators of one job on two engines at once, two jobs of the model at once."""
    arena, z = build("mixed", order="default", granularity="operator", dram_plan="arena")
    bump, _ = build("mixed", order="default", granularity="operator", dram_plan="bump")
    xs = [z.test[i : i + 1] for i in range(2)]
    want = [bump.run_int8(x) for x in xs]
    npu = Npu("model", "duo", dispatch="expected-time")
    m = npu.load(arena.to_container(), "mixed", instances=2)
    jobs = [m.submit(x, int8=True, at=i * 300) for i in range(3) for x in xs]
    npu.run_all()
    assert all(_same(j.outputs, want[k % 2]) for k, j in enumerate(jobs))
    assert any(len(j.engines_used) == 2 for j in jobs)


@pytest.mark.parametrize("name", ["inception_small", "perception"])
def test_preemption_at_every_point_with_the_arena(build, name):
    """Paused at every cancellation point (interval points with live on-chip data included), an
    urgent model run, resumed: the same bits as without the arena and without pauses."""
    low, z = build(name, cp_interval=20_000, order="default")
    bump, _ = build(name, cp_interval=20_000, order="default", dram_plan="bump")
    urgent, zu = build("planning")
    x = z.test[:1]
    npu = Npu("model", "default")
    lo, hi = npu.load(low.to_container(), "low"), npu.load(urgent.to_container(), "urgent")
    got, records = preempt_at_every_point(npu, lo, x, hi, zu.test[:1])
    points = low.lowered.points
    assert [r.cp for r in records] == [p.id for p in points]
    assert any(p.kind == "interval" for p in points)
    assert _same(got, bump.run_int8(x))


def test_a_model_too_large_for_one_range_per_tensor_fits_with_the_arena(tmp_path):
    """On `tiny` (64 KiB of DRAM): eight 1x1 convolutions over 24x24x16 activations need 81 KiB with
    one range per tensor, the arena holds two at a time."""
    net = Net("deep", (1, 16, 24, 24), seed=31)
    x = net.input
    for _ in range(8):
        x = net.conv(x, 16, 1)
    path = tmp_path / "deep.onnx"
    onnx.save(net.model([x]), str(path))
    rng = np.random.default_rng(31)
    calib = rng.normal(size=(4, 16, 24, 24)).astype(np.float32)
    with pytest.raises(CompileError, match="the model needs more than the 65536 bytes of DRAM"):
        compile_onnx(path, "tiny", calib=calib, dram_plan="bump")
    cm = compile_onnx(path, "tiny", calib=calib)
    p = cm.dram_plan
    assert p.bump_bytes > 65536 > cm.program_base + len(cm.lowered.program) * 32
    assert p.arena_bytes == p.lower_bound == 2 * 16 * 24 * 24
    compare_int8(cm, rng.normal(size=(1, 16, 24, 24)).astype(np.float32))


# -- (c) close to the lower bound -----------------------------------------------------------------


@IMAGENET_GROUP
@pytest.mark.parametrize("name", list(zoo.IMAGENET))
def test_arena_peak_is_within_1_3x_of_the_lower_bound_on_imagenet_class_models(imagenet_int8, name, capsys):
    t0 = time.perf_counter()
    cm, _ = imagenet_int8(name)
    p = cm.dram_plan
    with capsys.disabled():
        print(
            f"\n{name}: arena peak {p.arena_bytes} bytes, lower bound {p.lower_bound}, one range per "
            f"tensor {p.bump_bytes} ({p.tensors} tensors), constants {p.const_bytes}, DRAM used "
            f"{cm.lowered.dram_end} ({time.perf_counter() - t0:.1f} s)"
        )
    assert p.lower_bound <= p.arena_bytes <= 1.3 * p.lower_bound
    assert p.arena_bytes < p.bump_bytes / 3
    assert f"arena of {p.arena_bytes} bytes" in cm.report()


# -- (d) the memory objective ---------------------------------------------------------------------


def test_the_min_peak_order_is_the_smallest_over_every_order():
    """The dynamic programming finds the smallest peak an exhaustive enumeration finds."""
    low = _lowering(zoo.inception_small())
    mem = LiveMemory(low)
    deps = [f.deps for f in low.frags]
    for g in subgraphs(deps, merge_below=1):
        orders = list(topo_orders(g, deps))
        if len(orders) > 5000:
            continue
        order, peak = mem.best_order(g, deps)
        assert order in orders
        assert peak == mem.peak(g, order) == min(mem.peak(g, o) for o in orders)


@pytest.mark.parametrize("name", ["inception_small", "mixed", "squeezenet_like", "wide_branch"])
def test_memory_objective_lowers_the_bound(build, name, capsys):
    onnx_order, z = build(name, order="default")
    cyc, _ = build(name)
    mem, _ = build(name, order_objective="memory")
    d, a, b = onnx_order.dram_plan, cyc.dram_plan, mem.dram_plan
    with capsys.disabled():
        print(
            f"\n{name}: lower bound {d.lower_bound} (ONNX order), {a.lower_bound} (cycles objective), "
            f"{b.lower_bound} (memory objective); arena {d.arena_bytes}, {a.arena_bytes}, {b.arena_bytes}"
        )
    assert b.lower_bound <= min(a.lower_bound, d.lower_bound)
    if name == "wide_branch":
        assert b.lower_bound < d.lower_bound
    assert mem.search.objective == "memory" and b.lower_bound == mem.search.peak
    x = z.test[: z.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value]
    assert _same(mem.run_int8(x), cyc.run_int8(x))


# -- (e) options ----------------------------------------------------------------------------------


def test_order_objective_option_and_its_errors(build, tmp_path, capsys):
    cm, z = build("mixed")
    path = tmp_path / "mixed.onnx"
    onnx.save(z.model, str(path))
    np.save(tmp_path / "calib.npy", z.calib)
    args = ["compile", str(path), "-o", str(tmp_path / "m.npub"), "--calib", str(tmp_path / "calib.npy")]
    with pytest.raises(SystemExit):
        main([*args, "--order-objective", "latency"])
    assert (
        "--order-objective: invalid choice: 'latency' (choose from 'cycles', 'memory')"
        in capsys.readouterr().err
    )
    assert main([*args, "--order-objective", "memory", "--report"]) == 0
    out = capsys.readouterr().out
    assert "searched for memory" in out and "share an arena of" in out and "lower bound" in out
    with pytest.raises(CompileError, match="order_objective must be one of cycles, memory, not 'latency'"):
        compile_onnx(path, CFG, calib=z.calib, order_objective="latency")
    with pytest.raises(CompileError, match="dram_plan must be one of arena, bump, not 'heap'"):
        compile_onnx(path, CFG, calib=z.calib, dram_plan="heap")
    with pytest.raises(ValueError, match="objective must be 'cycles' or 'memory'"):
        search_order(_lowering(z), objective="size")
