"""Tenant isolation on the driver's side: a container whose manifest would reach outside its own
image (another model's weights or program), or that breaks the manifest's rules, is refused at load
naming the field, before anything is written; a model already loaded keeps giving the same result."""

from __future__ import annotations

import copy
import hashlib
import json

import numpy as np
import pytest

from npu.container import HEADER, MAGIC, VERSION, Container, ContainerError
from npu.driver import DriverError, Npu
from npu.driver.demo import compile_zoo
from npu.errors import NpuError

CFG = "tiny"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    cache = tmp_path_factory.mktemp("isolation")
    victim, x = compile_zoo("digits_mlp", CFG, cache)
    other, y = compile_zoo("planning", CFG, cache)
    return victim, x, other, y


def _mutated(c: Container, edit) -> Container:
    """`c` with its manifest's JSON changed by `edit`, signed again (a valid checksum), read back."""
    raw = c.manifest.to_json()
    edit(raw)
    payload, index = bytearray(), {}
    for name, data in c.blobs.items():
        index[name] = {"offset": len(payload), "length": len(data)}
        payload += data
    raw["blobs"] = index
    mb = json.dumps(raw, sort_keys=True).encode()
    digest = hashlib.sha256(mb + payload).digest()
    blob = HEADER.pack(MAGIC, VERSION, 0, c.config_id, len(mb), len(payload), digest) + mb + payload
    return Container.from_bytes(blob, "mutated.npub")


def _number_paths(obj, kinds, path: list | None = None) -> list[list]:
    """The paths (keys and indices) of every number of `kinds` in a JSON object (booleans left out)."""
    path = path or []
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _number_paths(v, kinds, [*path, k])]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _number_paths(v, kinds, [*path, i])]
    return [path] if isinstance(obj, kinds) and not isinstance(obj, bool) else []


def _set(path: list, value):
    def edit(raw):
        obj = raw
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value

    return edit


CASES = [
    (["dram", 0, "addr"], -4096, "manifest.dram[0].addr"),
    (["dram", 0, "addr"], 1 << 40, "manifest.dram[0].addr"),
    (["program", "base"], -4096, "manifest.program.base"),
    (["segments"], [], "manifest.segments: empty"),
    (["segments", 0, "deps"], [7], "manifest.segments[0].deps: 7 is not an earlier segment"),
    (["inputs", 0, "addr"], -64, "manifest.inputs[0].addr"),
    (["outputs", 0, "addr"], -(4 << 20), "manifest.outputs[0].addr"),
    (["outputs", 0, "shape"], [1, 10**7], "manifest.outputs[0].layout"),
    (["outputs", 0, "zero_point"], 10**6, "manifest.outputs[0].zero_point"),
    (["cancel_points", 0, "live_bytes"], -1, "manifest.cancel_points[0].live_bytes"),
    (["segments", 0, "end"], 1, "manifest.segments[0]"),
]


@pytest.mark.parametrize(("path", "value", "field"), CASES, ids=[c[2].split(":")[0] for c in CASES])
def test_a_manifest_breaking_a_rule_is_refused_naming_the_field(models, path, value, field):
    victim, x, other, _ = models
    npu = Npu("model", CFG)
    a = npu.load(victim, "victim")
    want = a.run(x)
    with pytest.raises(ContainerError, match=field.replace("[", r"\[").replace("]", r"\]")):
        npu.load(_mutated(other, _set(path, value)), "intruder")
    assert all(np.array_equal(g, w) for g, w in zip(a.run(x), want, strict=True))


def test_two_images_at_one_address_are_refused(models):
    _, _, other, _ = models
    if len(other.manifest.dram) < 2:
        pytest.skip("the model has one DRAM image")

    def edit(raw):
        raw["dram"][1]["addr"] = raw["dram"][0]["addr"]

    with pytest.raises(ContainerError, match=r"manifest.dram\[1\]: .* overlaps"):
        Npu("model", CFG).load(_mutated(other, edit))


def test_a_program_storing_outside_its_data_is_refused(models):
    """A STORE moved below address 0 of the model's image (relocated into the previous model's
    region) is found in the program itself."""
    from npu.container import relocate_program

    _, _, other, _ = models
    base = other.manifest.program.base
    moved = relocate_program(other.blobs["program"], base)  # every LOAD/STORE now at or above base
    c = Container(other.config_id, copy.deepcopy(other.manifest), {**other.blobs, "program": moved})
    with pytest.raises(ContainerError, match=r"manifest.program: pc \d+: (LOAD reads|STORE writes) DRAM"):
        Npu("model", CFG).load(c)


MUTATIONS = 5000


def test_seeded_manifest_mutations_never_reach_a_loaded_model(models):
    """Numeric fields of the manifest changed at random (checksum recomputed): each file is refused
    with a ContainerError, or loads and runs (or fails) with an NpuError - never another exception -
    and the model loaded first keeps its DRAM bytes and its result after every one."""
    victim, x, other, y = models
    npu = Npu("model", CFG)
    a = npu.load(victim, "victim")
    want = a.run(x)
    lo, hi = a.region
    image = npu.tr.read_dram(lo, hi - lo)
    leaves = _number_paths(other.manifest.to_json(), int | float)
    rng = np.random.default_rng(41)
    values = [-1, 0, 1, 7, -(1 << 20), 1 << 20, 1 << 31, 10**7, -2.5, 0.0, 1e30, float("nan")]
    refused = ran = failed = 0
    for _ in range(MUTATIONS):
        path = leaves[int(rng.integers(len(leaves)))]
        pick = int(rng.integers(len(values) + 1))
        value = values[pick] if pick < len(values) else int(rng.integers(-4096, 1 << 16))
        try:
            m = npu.load(_mutated(other, _set(path, value)), "mutant")
        except NpuError:  # ContainerError (refused whole) or DriverError (does not fit)
            refused += 1
            continue
        try:
            m.run(y)
            ran += 1
        except NpuError:
            failed += 1
        npu.unload(m)
        assert npu.tr.read_dram(lo, hi - lo) == image, (path, value)
        got = a.run(x)
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), (path, value)
    print(f"\n{MUTATIONS} mutations: {refused} refused at load, {ran} ran, {failed} failed with an NpuError")
    assert refused > MUTATIONS // 10 and ran > 0


def test_a_long_running_device_stays_flat():
    """20,000 jobs through one Npu: the job table and the trace stay bounded and the process's
    resident memory grows by less than 10 % after the warm-up (host time per job: `npu bench
    service`, not asserted here)."""
    from npu.driver.service_bench import bench_service

    r = bench_service(CFG, 20_000, history=1000)
    for w in r["windows"]:
        print(f"{w['jobs']} jobs: {w['us_per_job']} us/job, {w['rss_mb']} MB")
    assert r["jobs"] == 20_000
    assert all(w["job_records"] <= 2 * 1000 + 64 for w in r["windows"])
    assert all(w["trace_events"] <= 25_000 for w in r["windows"])
    assert r["rss_ratio"] < 1.10, r["windows"]


def test_a_long_running_device_keeps_bounded_history(models):
    """Finished jobs beyond `history` and trace events beyond `max_events` are let go."""
    victim, x, _, _ = models
    npu = Npu("model", CFG, history=10)
    npu.trace.max_events = 200
    a = npu.load(victim)
    for _ in range(300):
        a.run(x)
    assert len(npu.jobs) <= 2 * 10 + 64 and sum(j.done() for j in npu.jobs) >= 10
    assert len(npu.trace.events) <= 250 and npu.trace.dropped > 0
    assert npu.trace.to_chrome()["metadata"]["dropped_events"] == npu.trace.dropped


def test_a_closed_device_takes_no_more_work(models):
    victim, x, _, _ = models
    npu = Npu("model", CFG)
    a = npu.load(victim)
    a.run(x)
    npu.close()
    with pytest.raises(DriverError, match="the device is closed"):
        a.run(x)
    with pytest.raises(DriverError, match="the device is closed"):
        npu.load(victim)


def test_an_interrupted_save_leaves_the_old_file_whole(models, tmp_path, monkeypatch):
    victim, _, other, _ = models
    path = tmp_path / "m.npub"
    victim.save(path)
    before = path.read_bytes()

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.replace", full)
    with pytest.raises(OSError, match="No space left"):
        other.save(path)
    assert path.read_bytes() == before and Container.load(path).manifest == victim.manifest
    assert [p.name for p in tmp_path.iterdir()] == ["m.npub"]  # no temporary file left behind


def test_mutated_files_through_npu_run_end_in_a_clear_error_never_an_internal_one(models, tmp_path, capsys):
    """`npu run` of seeded mutations of a valid file (checksum recomputed): each runs, or ends in
    `npu: error: ...` (exit 1 or 2), never in an internal error."""
    from npu.cli import main

    _, _, other, y = models
    np.save(tmp_path / "x.npy", y)
    leaves = _number_paths(other.manifest.to_json(), int | float)
    rng = np.random.default_rng(7)
    codes = []
    for i in range(1000):  # until 50 files reach `npu run`
        if len(codes) == 50:
            break
        path = leaves[int(rng.integers(len(leaves)))]
        value = [-(4 << 20), -1, 0, 10**7, 10**6, 0.0, -2.5][int(rng.integers(7))]
        try:
            c = _mutated(other, _set(path, value))
        except ContainerError:
            continue  # refused while reading: the file never reaches `npu run` as a valid container
        f = tmp_path / f"m{i}.npub"
        c.save(f)
        code = main(["run", str(f), "--config", CFG, "--input", str(tmp_path / "x.npy")])
        err = capsys.readouterr().err
        assert code in (0, 1, 2) and "internal error" not in err, (path, value, err)
        codes.append(code)
    assert len(codes) == 50 and 2 in codes, codes


def escape_scenario(transport, victim, attacker, x, y):
    """Runs on any backend: the attacker's program, changed in DRAM after a clean load (a bit flip,
    or a driver bug), STOREs into the victim's region. Returns what the test checks."""
    import dataclasses

    from npu.driver import JobError
    from npu.isa import Opcode, decode, encode

    npu = Npu(transport=transport, config=victim.manifest.config)
    v, a = npu.load(victim, "victim"), npu.load(attacker, "attacker")
    want = v.run(x)
    lo, hi = v.region
    before = npu.tr.read_dram(lo, hi - lo)
    base = a.program_base
    n = a.manifest.program.instructions
    prog = npu.tr.read_dram(base, 32 * n)
    k = next(i for i in range(n) if decode(prog[32 * i : 32 * i + 32]).op == Opcode.STORE)
    store = decode(prog[32 * k : 32 * k + 32])
    evil = dataclasses.replace(store, fields={**store.fields, "dram": lo})
    npu.tr.write_dram(base + 32 * k, encode(evil))
    try:
        a.run(y)
        err = None
    except JobError as e:
        err = (int(e.code), e.pc, str(e))
    after = npu.tr.read_dram(lo, hi - lo)
    return err, k, lo, before == after, [np.array_equal(g, w) for g, w in zip(v.run(x), want, strict=True)]


def _check_escape(result, where):
    err, k, lo, untouched, same = result
    assert err is not None, f"{where}: the changed program ran to the end"
    code, pc, msg = err
    assert (code, pc) == (10, k), (where, err)  # PROTECTION at the changed STORE
    assert f"DRAM address 0x{lo:x} is outside the model's memory window" in msg, msg
    assert untouched and all(same), where


def test_a_program_changed_after_load_is_stopped_by_the_memory_window(models):
    from npu.config import get_config
    from npu.driver import ModelTransport

    victim, x, other, y = models
    _check_escape(escape_scenario(ModelTransport(get_config(CFG)), victim, other, x, y), "model")


@pytest.mark.rtl
def test_a_program_changed_after_load_is_stopped_by_the_memory_window_on_the_rtl(models):
    from npu.sim.rtl.transport import run_on_rtl

    victim, x, other, y = models
    _check_escape(run_on_rtl(escape_scenario, victim, other, x, y, config=CFG, dram_bytes=1 << 18), "rtl")
