"""On-chip regions (`spad_region`/`acc_region`): every instruction stays inside its model's regions,
the results do not change, two models in disjoint regions can have their segments interleaved in one
instruction stream, and the per-segment figures a layer-wise scheduler reads are in the container."""

import json
import random

import numpy as np
import onnx
import pytest

from npu.arith import round_up
from npu.compiler import CompileError, compile_onnx
from npu.config import ACC_BASE, get_config
from npu.container import Container, HostStep, Manifest, NpuSegment, relocate
from npu.executor import HostSteps, check_inputs, read_outputs, write_inputs
from npu.isa import Opcode, decode_program, encode_program, footprint, make
from npu.models import zoo
from npu.program import check_tokens
from npu.sim.golden.model import NpuModel
from npu.sim.golden.runner import ModelDevice
from npu.timing import dma_bytes

CFG = get_config("default")
HALF = CFG.spad_bytes // 2
LOWER, UPPER = (0, HALF), (HALF, HALF)
MODELS = ["planning", "digits_cnn", "resnet_small", "perception"]


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """compile(name, spad_region=None, **kw) -> (CompiledModel, test input), cached per module."""
    d = tmp_path_factory.mktemp("region")
    cache: dict = {}
    zoos: dict = {}  # building a zoo model may train it: once per name

    def compile_(name: str, spad_region=None, **kw):
        kw.setdefault("granularity", "operator")
        key = (name, spad_region, tuple(sorted(kw.items())))
        if key not in cache:
            if name not in zoos:
                zoos[name] = getattr(zoo, name)()
                onnx.save(zoos[name].model, str(d / f"{name}.onnx"))
            z, path = zoos[name], d / f"{name}.onnx"
            cm = compile_onnx(
                path,
                "default",
                calib=z.calib,
                order="default",
                spad_region=spad_region,
                **kw,
            )
            cache[key] = (cm, z.test[:1])
        return cache[key]

    return compile_


def _instrs(cm) -> list:
    return decode_program(cm.to_container().blobs["program"])


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("spad", [LOWER, UPPER], ids=["lower", "upper"])
def test_every_onchip_access_lies_inside_the_regions(build, name, spad):
    cm, _ = build(name, spad)
    man = cm.manifest
    assert man.spad_region == list(spad)
    # the accumulator region by default: the scratchpad region's share of the accumulators
    assert man.acc_region == [spad[0] // 4, CFG.acc_bytes // 2]
    (s0, s1), (a0, a1) = man.onchip_ranges(CFG)
    inside = lambda s, e: s0 <= s and e <= s1 or a0 <= s and e <= a1  # noqa: E731
    for pc, ins in enumerate(_instrs(cm)):
        reads, writes = footprint(ins)
        for sp in reads + writes:
            if sp.space == "onchip":
                assert inside(sp.start, sp.end), (pc, ins)
    for p in man.cancel_points:  # what a preemption would dump and restore
        assert all(inside(s, e) for s, e in p.live_ranges), p


@pytest.mark.parametrize("name", MODELS)
def test_results_are_bit_identical_to_the_whole_memory(build, name):
    # only addresses change (and tiles, in a smaller region): int8 results are the same bits, since
    # partial sums of split operators accumulate exactly in int32 before one requantisation
    full, x = build(name)
    want = full.run_int8(x)
    for spad in (LOWER, UPPER, (0x2000, 0x8000)):
        got = build(name, spad)[0].run_int8(x)
        for a, b in zip(want, got, strict=True):
            assert np.array_equal(a, b), (name, spad)


def test_interval_points_live_ranges_are_in_the_region(build):
    cm, x = build("perception", UPPER, cp_interval=20_000)
    full, _ = build("perception", None, cp_interval=20_000)
    interval = [p for p in cm.manifest.cancel_points if p.kind == "interval"]
    assert interval and any(p.live_bytes for p in interval)
    lo, hi = UPPER[0], sum(UPPER)
    acc_lo = ACC_BASE + cm.regions.acc_start
    for p in interval:
        for s, e in p.live_ranges:
            assert lo <= s < e <= hi or acc_lo <= s < e <= acc_lo + cm.regions.acc_size
    assert all(np.array_equal(a, b) for a, b in zip(full.run_int8(x), cm.run_int8(x), strict=True))


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("granularity", ["operator", "segment"])
def test_segments_start_and_end_with_no_outstanding_token(build, name, granularity):
    cm, _ = build(name, LOWER, **({} if granularity == "operator" else {"granularity": "segment"}))
    instrs = _instrs(cm)
    npu = [s for s in cm.manifest.segments if isinstance(s, NpuSegment)]
    assert npu[0].pc == 0 and npu[-1].end == len(instrs) - 1
    for s in npu:
        body = instrs[s.pc : s.end + 1]
        assert body[-1].op == Opcode.END and all(i.op != Opcode.END for i in body[:-1])
        check_tokens(body, CFG)  # raises on a token popped before it was pushed or left outstanding
        assert body[0].wait == 0  # nothing to wait for from an earlier segment


# -- two models resident at once -----------------------------------------------------------------


def _resident(cm, dram_off: int):
    """(manifest, program, blobs) of a compiled model moved `dram_off` bytes up in DRAM."""
    c = cm.to_container()
    man, prog = relocate(c.manifest, c.blobs["program"], dram_off)
    return man, decode_program(prog), c.blobs


def _dram_end(man: Manifest) -> int:
    return man.program.base + man.program.instructions * 32


def run_interleaved(models, seed: int, cfg=CFG) -> list[list[np.ndarray]]:
    """Run several compiled models on one golden model with their NPU segments concatenated into
    one instruction stream, as a layer-wise scheduler feeds the command ring: in a random order that
    respects each model's segment dependencies, in groups of at most one segment per model. A
    BARRIER and a FENCE separate the groups: the barrier orders a model's segment after its previous
    one (what the host does by appending it once the fence has completed; a fence alone reports
    progress but does not order). Within a group nothing orders the models' instructions: one
    model's DMA runs under another's compute. A host step ends the stream so far and runs on the
    host. Returns each model's int8 outputs."""
    m = NpuModel(cfg)
    dev = ModelDevice(m)
    placed, off = [], 0
    for cm, x in models:
        man, instrs, blobs = _resident(cm, off)
        off = round_up(_dram_end(man), 4096)
        for d in man.dram:
            m.write_dram(d.addr, blobs[d.blob])
        env: dict = {}
        write_inputs(man, dev, check_inputs(man, [x]), env)
        placed.append((man, instrs, HostSteps(blobs, man.segments), env))
    stream_base = round_up(off, 4096)
    deps = [man.segment_deps() for man, *_ in placed]
    done = [set() for _ in placed]
    rng = random.Random(seed)
    stream: list = []
    group: set[int] = set()  # models with a segment since the last fence

    def flush() -> None:
        if stream:
            prog = stream + [make(Opcode.END)]
            check_tokens(prog, cfg)  # segments join with no token across the seams
            m.load_program(encode_program(prog), stream_base)
            dev.run_segment(0)
            stream.clear()
        group.clear()

    while any(len(d) < len(man.segments) for d, (man, *_) in zip(done, placed, strict=True)):
        ready = [
            (k, i)
            for k, (man, *_) in enumerate(placed)
            for i in range(len(man.segments))
            if i not in done[k] and all(j in done[k] for j in deps[k][i])
        ]
        k, i = rng.choice(ready)
        man, instrs, host, env = placed[k]
        seg = man.segments[i]
        if isinstance(seg, HostStep):
            flush()  # the host reads what the NPU wrote
            host.run(dev, seg, env)
        else:
            if k in group:
                stream += [make(Opcode.BARRIER), make(Opcode.FENCE)]
                group.clear()
            stream.extend(instrs[seg.pc : seg.end])  # without its END
            group.add(k)
        done[k].add(i)
    flush()
    return [read_outputs(man, dev, env, int8=True) for man, _, _, env in placed]


@pytest.mark.parametrize(
    "pair",
    [("perception", "planning"), ("resnet_small", "digits_cnn"), ("perception", "resnet_small")],
    ids=["perception+planning", "resnet+digits", "perception+resnet"],
)
def test_segments_of_two_models_in_disjoint_regions_interleave_in_any_order(build, pair):
    a, b = build(pair[0], LOWER), build(pair[1], UPPER)
    assert not a[0].manifest.shares_onchip(b[0].manifest, CFG)
    alone = [a[0].run_int8(a[1]), b[0].run_int8(b[1])]
    for seed in range(3):
        got = run_interleaved([a, b], seed)
        for want, have in zip(alone, got, strict=True):
            assert all(np.array_equal(w, h) for w, h in zip(want, have, strict=True)), seed


def test_without_regions_the_same_interleaving_corrupts_results(build):
    """The control: both models in the whole memory share buffers, and the stream that is exact with
    disjoint regions computes wrong results (the golden model applies each instruction's data when
    the instruction starts, so a LOAD of one model overwrites a tile the other still reads)."""
    a, b = build("perception"), build("resnet_small")
    assert a[0].manifest.shares_onchip(b[0].manifest, CFG)
    alone = [a[0].run_int8(a[1]), b[0].run_int8(b[1])]
    got = run_interleaved([a, b], 0)
    same = all(
        np.array_equal(w, h) for ws, hs in zip(alone, got, strict=True) for w, h in zip(ws, hs, strict=True)
    )
    assert not same


# -- the per-segment figures -----------------------------------------------------------------------


FIGURES = ("spad_bytes", "acc_bytes", "dma_rd_bytes", "dma_wr_bytes", "dma_cycles", "compute_cycles")


@pytest.mark.parametrize("name", ["resnet_small", "perception"])
def test_segment_figures_are_recorded_and_match_the_instructions(build, name):
    cm, _ = build(name, UPPER)
    instrs = _instrs(cm)
    for s in (s for s in cm.manifest.segments if isinstance(s, NpuSegment)):
        body = instrs[s.pc : s.end]
        assert all(getattr(s, f) is not None for f in FIGURES)
        assert s.dma_rd_bytes == sum(dma_bytes(i)[0] for i in body) > 0
        assert s.dma_wr_bytes == sum(dma_bytes(i)[1] for i in body) > 0
        assert s.dma_cycles > 0 and s.est_cycles >= max(s.compute_cycles, s.dma_cycles // 2)
        assert 0 < s.spad_bytes <= UPPER[1] and 0 <= s.acc_bytes <= cm.regions.acc_size
        if any(i.op == Opcode.MATMUL for i in body):
            assert s.acc_bytes > 0 and s.compute_cycles > 0
        if any(i.op in (Opcode.VMAP, Opcode.VADD, Opcode.POOL) for i in body):
            assert s.compute_cycles > 0


def test_regions_and_figures_round_trip_and_older_files_still_load(build):
    cm, _ = build("resnet_small", UPPER)
    c = cm.to_container()
    back = Container.from_bytes(c.to_bytes())
    assert back.manifest.segments == c.manifest.segments
    assert (back.manifest.spad_region, back.manifest.acc_region) == ([HALF, HALF], [CFG.acc_bytes // 2] * 2)
    raw = json.loads(json.dumps(c.manifest.to_json()))
    for s in raw["segments"]:
        for f in FIGURES:
            s.pop(f, None)
    del raw["spad_region"], raw["acc_region"]
    old = Manifest.from_json(raw)
    assert old.spad_region is None and old.onchip_ranges(CFG) == [
        (0, CFG.spad_bytes),
        (ACC_BASE, ACC_BASE + CFG.acc_bytes),
    ]
    assert all(s.spad_bytes is None for s in old.segments if isinstance(s, NpuSegment))
    # a compile without regions records none (the whole memories) and keeps the figures
    full = build("resnet_small")[0].manifest
    assert full.spad_region is None and "spad_region" not in full.to_json()
    assert all(s.spad_bytes for s in full.segments if isinstance(s, NpuSegment))


# -- errors ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def planning_onnx(tmp_path_factory):
    z = zoo.planning()
    path = tmp_path_factory.mktemp("plan") / "p.onnx"
    onnx.save(z.model, str(path))
    return path, z.calib


@pytest.mark.parametrize(
    "kw, message",
    [
        (
            dict(spad_region=(HALF, CFG.spad_bytes)),
            r"spad_region \[0x20000, 0x60000\) is outside the 262144-byte scratchpad",
        ),
        (dict(spad_region=(-8, 64)), "spad_region .* is outside"),
        (dict(spad_region=(4, 1024)), "spad_region start 4 is not a multiple of 8 bytes"),
        (dict(spad_region=(0, 1028)), "spad_region size 1028 is not a multiple of 8 bytes"),
        (dict(spad_region=(0, 0)), r"spad_region \(0, 0\) is empty"),
        (
            dict(acc_region=(0, CFG.acc_bytes + 16)),
            "acc_region .* is outside the 65536-byte accumulator memory",
        ),
        (dict(acc_region=(8, 64)), "acc_region start 8 is not a multiple of 16 bytes"),
        (dict(spad_region=(0, 16)), "leaves no whole accumulator row"),
    ],
)
def test_bad_regions_are_refused(planning_onnx, kw, message):
    path, calib = planning_onnx
    with pytest.raises(CompileError, match=message):
        compile_onnx(path, "default", calib=calib, order="default", **kw)


def test_a_region_too_small_names_the_region_and_the_need(build):
    with pytest.raises(
        CompileError,
        match=r"conv\d+ \(Conv\): no tiling fits the 2048-byte scratchpad region "
        r"\[0x0, 0x800\) and the 512-byte accumulator region \[0x0, 0x200\): .*one output row of 1 "
        r"pixels.* needs \d+ scratchpad and \d+ accumulator bytes \(also split into strips",
    ):
        build("perception", (0, 2048))  # 4096 bytes fit since convolutions split their width
    with pytest.raises(
        CompileError,
        match=r"Gemm\): no GEMM tiling of 1x128x64 fits the 64-byte scratchpad region "
        r"\[0x40, 0x80\) .* needs 160 scratchpad",
    ):
        build("planning", (64, 64), acc_region=(0, 4096))


def test_a_banked_scratchpad_refuses_regions(planning_onnx):
    path, calib = planning_onnx
    with pytest.raises(CompileError, match="not supported on banked"):
        compile_onnx(path, "banked", calib=calib, spad_region=(0, 64 * 1024))


def test_command_line_regions(planning_onnx, tmp_path, capsys):
    from npu.cli import main

    path, calib = planning_onnx
    np.save(tmp_path / "calib.npy", calib)
    out = tmp_path / "p.npub"
    args = ["compile", str(path), "-o", str(out), "--calib", str(tmp_path / "calib.npy")]
    assert (
        main([*args, "--spad-region", "0x10000:64K", "--acc-region", "0:4K", "--granularity", "operator"])
        == 0
    )
    man = Container.load(out).manifest
    assert (man.spad_region, man.acc_region) == ([0x10000, 0x10000], [0, 4096])
    assert "scratchpad region [0x10000, 0x20000)" in capsys.readouterr().out
    assert main(["disasm", str(out)]) == 0
    text = capsys.readouterr().out
    assert "on-chip regions: scratchpad [0x10000, 0x20000), accumulators [0x80000, 0x81000)" in text
    assert "DMA" in text and "B scratchpad" in text
    assert main([*args, "--spad-region", "0x10000:3"]) == 2
    assert "spad_region size 3 is not a multiple of 8 bytes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--spad-region", "64K"])
    assert "not START:SIZE" in capsys.readouterr().err
