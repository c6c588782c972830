"""Pipelines: queue semantics, back-pressure, end of stream, errors, cancellation and
model runners with preemption on a shared Npu."""

from __future__ import annotations

import _thread
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from npu.driver import Npu, Priority
from npu.driver.pipeline import Pipeline, PipelineError, StageError, load_graph

ROOT = Path(__file__).resolve().parents[2]
S = "tests.driver.pipeline_stages"


def collector() -> tuple[type, list]:
    box: list = []

    class Sink:
        def __call__(self, x):
            box.append(x)

    return Sink, box


def test_basic_queue_keeps_order_with_one_worker_and_every_frame_with_many():
    sink, got = collector()
    p = Pipeline(paths=[str(ROOT)])
    p.source("src", f"{S}:numbers", args={"n": 50})
    p.stage("sq", f"{S}:square", workers=1)
    p.stage("sink", sink)
    p.chain("src", "sq", "sink", size=3)
    r = p.run(progress=False)
    assert got == [i * i for i in range(50)]
    assert (r.frames, r.lost, r.duplicated) == (50, 0, 0)

    sink, got = collector()
    p = Pipeline(paths=[str(ROOT)])
    p.source("src", f"{S}:numbers", args={"n": 60})
    p.stage("j", f"{S}:jitter", workers=4, args={"scale": 0.004})
    p.stage("sink", sink)
    p.chain("src", "j", "sink", size=2)
    r = p.run(progress=False)
    assert sorted(got) == list(range(60)) and r.lost == r.duplicated == 0


def test_ordered_stage_restores_stream_order_after_parallel_workers():
    sink, got = collector()
    p = Pipeline()
    p.source("src", f"{S}:numbers", args={"n": 40})
    p.stage("j", f"{S}:jitter", workers=3, args={"scale": 0.01})
    p.stage("sink", sink, ordered=True)
    p.chain("src", "j", "sink")
    p.run(progress=False)
    assert got == list(range(40))


def test_sync_queue_joins_results_of_the_same_frame():
    sink, got = collector()
    p = Pipeline()
    p.source("src", f"{S}:numbers", args={"n": 30})
    p.stage("a", f"{S}:jitter", workers=2, args={"scale": 0.01})
    p.stage("b", f"{S}:negate", workers=3)
    p.stage("join", sink)
    p.queue("fan", "copy", 4, producers=["src"], consumers=["a", "b"])
    p.queue("sync", "sync", 4, producers=["a", "b"], consumers=["join"])
    r = p.run(progress=False)
    assert len(got) == 30
    for entry in got:
        assert set(entry) == {"a", "b"} and entry["b"] == -entry["a"]
    assert sorted(e["a"] for e in got) == list(range(30))
    assert r.queues["sync"]["max_depth"] <= 2 * 4  # bounded: each producer kind holds <= size entries


def test_copy_queue_gives_each_consumer_its_own_copy():
    box1: list = []
    box2: list = []

    class Mutator:
        def __call__(self, d):
            d["x"] += 1000  # must not leak into the other consumer's copy
            box1.append(d["x"])

    class Reader:
        def __call__(self, d):
            box2.append(d["x"])

    def dicts():
        return ({"x": i} for i in range(25))

    p = Pipeline()
    p.source("src", dicts)
    p.stage("m", Mutator)
    p.stage("r", Reader)
    p.queue("fan", "copy", 3, producers=["src"], consumers=["m", "r"])
    r = p.run(progress=False)
    assert sorted(box2) == list(range(25))
    assert sorted(box1) == [1000 + i for i in range(25)]
    assert r.lost == r.duplicated == 0 and r.queues["fan"]["puts"] == 25


def test_back_pressure_bounds_the_queue_behind_a_slow_consumer():
    p = Pipeline()
    p.source("src", f"{S}:numbers", args={"n": 30})
    p.stage("slow", f"{S}:slow", args={"s": 0.01})
    p.queue("q", "basic", 3, producers=["src"], consumers=["slow"])
    emitted_at: dict[int, float] = {}
    r = p.run(progress=False)
    assert r.queues["q"]["max_depth"] <= 3
    # the source could not run ahead: frame i left the source only after frame i - 3 - 1 was taken
    src = sorted((s for s in r.spans if s.stage == "src"), key=lambda s: s.frame[1])
    slow = sorted((s for s in r.spans if s.stage == "slow"), key=lambda s: s.frame[1])
    for i in range(5, 30):
        emitted_at[i] = src[i].end
        assert emitted_at[i] >= slow[i - 5].start - 1e-3


@pytest.mark.parametrize(("w1", "w2"), [(3, 2), (2, 3)])
def test_end_of_stream_with_unequal_worker_counts(w1, w2):
    sink, got = collector()
    p = Pipeline()
    p.source("src", f"{S}:numbers", args={"n": 41})
    p.stage("one", f"{S}:jitter", workers=w1, args={"scale": 0.003})
    p.stage("two", f"{S}:square", workers=w2)
    p.stage("sink", sink)
    p.chain("src", "one", "two", "sink", size=2)
    r = p.run(progress=False)  # a lost end-of-stream hangs: pytest-timeout fails it
    assert sorted(got) == [i * i for i in range(41)] and r.lost == r.duplicated == 0
    assert r.stages["one"]["frames"] == 41 and r.stages["two"]["frames"] == 41


def test_process_workers_run_in_other_processes():
    import os

    sink, got = collector()
    p = Pipeline(paths=[str(ROOT)])
    p.source("src", f"{S}:numbers", args={"n": 12})
    p.stage("pid", f"{S}:pid", workers=2, processes=True)
    p.stage("sink", sink)
    p.chain("src", "pid", "sink")
    p.run(progress=False)
    assert sorted(x for x, _ in got) == list(range(12))
    assert os.getpid() not in {pid for _, pid in got}


@pytest.mark.parametrize("where", ["source", "thread", "process", "sink", "runner"])
def test_an_exception_in_any_stage_kind_stops_the_pipeline_naming_stage_and_frame(where, tmp_path):
    p = Pipeline(paths=[str(ROOT)])
    if where == "source":
        p.source("src", f"{S}:failing_source", args={"n": 100, "bad": 2})
    else:
        p.source("src", f"{S}:endless")  # never ends by itself: the error must stop it
    stages = ["src"]
    if where == "thread":
        p.stage("bad", f"{S}:fail_on", workers=2, args={"bad": 3})
        stages.append("bad")
    if where == "process":
        p.stage("bad", f"{S}:fail_on", workers=2, processes=True, args={"bad": 3})
        stages.append("bad")
    if where == "runner":
        from npu.driver.demo import compile_zoo

        npu = Npu("model")
        p.runner(
            "bad", npu.load(compile_zoo("planning", "default")[0])
        )  # integers, not the model's input shape: the job fails
        stages.append("bad")
    p.stage("slow", f"{S}:slow", args={"s": 0.001})
    stages.append("slow")
    if where == "sink":
        p.stage("bad", f"{S}:fail_on", args={"bad": 3})
        stages.append("bad")
    else:
        p.stage("end", f"{S}:square")
        stages.append("end")
    p.chain(*stages, size=2)
    with pytest.raises(PipelineError) as ei:  # an error that does not stop it hangs: pytest-timeout
        p.run(progress=False)
    msg = str(ei.value)
    name = "src" if where == "source" else "bad"
    assert f"stage {name!r} failed" in msg
    if where == "source":
        assert "camera unplugged" in msg
    elif where != "runner":
        assert "frame 3" in msg and "cannot take 3" in msg
    else:
        assert "frame 0" in msg and isinstance(ei.value, StageError)
    assert not [t for t in threading.enumerate() if "/" in t.name and t.is_alive()]


def test_ctrl_c_cancels_cleanly():
    p = Pipeline()
    p.source("src", f"{S}:endless")
    p.stage("slow", f"{S}:slow", workers=2, args={"s": 0.02})
    p.stage("end", f"{S}:square")
    p.chain("src", "slow", "end", size=2)
    # a test runner's worker may ignore SIGINT; Ctrl-C must reach this process's main thread
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.5, _thread.interrupt_main).start()
        with pytest.raises(KeyboardInterrupt):
            p.run(progress=False, timeout_s=30)
    finally:
        signal.signal(signal.SIGINT, old)
    assert not [t for t in threading.enumerate() if "/" in t.name and t.is_alive()]


def _wired(*queues: tuple[str, str, list[str], list[str]]) -> Pipeline:
    p = Pipeline()
    p.source("src", f"{S}:numbers")
    for n in "abc":
        p.stage(n, f"{S}:square")
    for name, kind, prod, cons in queues:
        p.queue(name, kind, producers=prod, consumers=cons)
    return p


@pytest.mark.parametrize(
    ("queues", "needle"),
    [
        ([("q", "basic", ["src"], ["nope"])], "queue 'q': unknown stage 'nope'"),
        (
            [("q", "basic", ["src"], ["a"]), ("s", "sync", ["a"], ["b"]), ("t", "basic", ["b"], ["c"])],
            "sync queue 's' is fed by one kind only",
        ),
        (
            [("q", "basic", ["src"], ["c"]), ("x", "basic", ["a"], ["b"]), ("y", "basic", ["b"], ["a"])],
            "cycle: a -> b -> a|cycle: b -> a -> b",
        ),
        (
            [("q", "basic", ["src"], ["a"]), ("r", "basic", ["b"], ["a"]), ("t", "basic", ["a"], ["c"])],
            "stage 'a' consumes two queues",
        ),
        (
            [("q", "basic", ["src"], ["a"]), ("r", "basic", ["src"], ["b"])],
            "stage 'src' produces into two queues",
        ),
        ([("q", "basic", ["src"], ["a"])], "stage 'b' has no input queue"),
    ],
)
def test_validation_errors_name_the_problem(queues, needle):
    with pytest.raises(PipelineError, match=needle):
        _wired(*queues).validate()


def test_unknown_queue_kind_is_refused():
    with pytest.raises(PipelineError, match="queue 'x': unknown kind 'weird'"):
        Pipeline().queue("x", "weird", producers=["a"], consumers=["b"])


def test_graph_file_errors(tmp_path):
    g = tmp_path / "g.yaml"
    g.write_text("stages:\n  src: {source: 'tests.driver.pipeline_stages:numbers', wokers: 2}\n")
    with pytest.raises(PipelineError, match=r"stages.src: unknown field\(s\) wokers"):
        load_graph(g)
    g.write_text("stages:\n  r: {model: nope}\nqueues: {}\n")
    with pytest.raises(PipelineError, match="unknown model 'nope'"):
        load_graph(g)
    g.write_text("stages:\n  src: {source: 'no_such_module:f'}\n")
    with pytest.raises(PipelineError, match="cannot import module 'no_such_module'"):
        load_graph(g)
    g.write_text("stages: [1, 2\n")
    with pytest.raises(PipelineError, match="not valid YAML"):
        load_graph(g)


def _gated(npu: Npu, xs: list, busy: str):
    """Yields each input once the device runs a job of model `busy`, so that every job of this
    stream arrives while the other runner's job runs."""

    def gen():
        for x in xs:
            t = time.perf_counter()
            while not (npu.current is not None and npu.current.model.name == busy):
                if time.perf_counter() - t > 120:  # a guard against waiting for ever, not a timing
                    raise TimeoutError(f"no {busy} job ran")
                time.sleep(0.0005)
            yield x

    return gen


def test_urgent_runner_preempts_another_inside_a_pipeline_bit_exact():
    from npu.driver.demo import compile_zoo

    perc, xp = compile_zoo("perception", "default", cp_interval=20_000)
    plan, xq = compile_zoo("planning", "default")
    rng = np.random.default_rng(5)
    xps = [xp + rng.normal(0, 0.3, xp.shape).astype(np.float32) for _ in range(3)]
    xqs = [xq + rng.normal(0, 0.3, xq.shape).astype(np.float32) for _ in range(3)]

    ref = Npu("model")
    P, Q = ref.load(perc, "perception"), ref.load(plan, "planning")
    want_p = [P.run(x)[0] for x in xps]
    want_q = [Q.run(x)[0] for x in xqs]

    npu = Npu("model")
    sp, got_p = collector()
    sq, got_q = collector()
    p = Pipeline(npu)
    p.source("frames", lambda: iter(xps))
    p.source("events", _gated(npu, xqs, "perception"))
    p.runner("perceive", npu.load(perc, "perception"), priority=Priority.LOW)
    p.runner("plan", npu.load(plan, "planning"), priority=Priority.HIGH)
    p.stage("out_p", sp, ordered=True)
    p.stage("out_q", sq, ordered=True)
    p.chain("frames", "perceive", "out_p")
    p.chain("events", "plan", "out_q")
    r = p.run(progress=False)
    assert r.npu["perceive"]["preemptions"] >= 1
    for a, b in zip(got_p, want_p, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(got_q, want_q, strict=True):
        np.testing.assert_array_equal(a, b)


def test_example_graph_runs_from_the_command_line(tmp_path, capsys):
    import json

    from npu.cli import main

    rc = main(["pipeline", "run", str(ROOT / "examples/pipelines/fusion.yaml"), "--frames", "4", "--json",
               "-o", str(tmp_path)])  # fmt: skip
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["frames"] == 4 and rep["lost"] == 0 and rep["duplicated"] == 0
    assert rep["sinks"]["log"]["frames"] == 4 and rep["sinks"]["show"]["frames"] == 4
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    tracks = {e.get("tid") for e in trace if e.get("pid") == 1 and e.get("ph") == "X"}
    assert {"camera/0", "detect/0", "classify/0", "fuse/0", "log/0", "show/0"} <= tracks
    assert tracks & {"prep_det/0", "prep_det/1"}
    assert any(e.get("pid") == 2 and e.get("ph") == "X" for e in trace)  # the NPU's device track
    assert (tmp_path / "pipeline.png").stat().st_size > 1000


def test_runners_share_the_engines_of_a_soc():
    from npu.driver.demo import compile_zoo

    c, x = compile_zoo("planning", "default")
    npu = Npu("model", "duo")
    m = npu.load(c, "planning", instances=2)
    sink, got = collector()
    p = Pipeline(npu)
    p.source("src", lambda: iter([x] * 8))
    p.runner("plan", m, workers=2)
    p.stage("sink", sink)
    p.chain("src", "plan", "sink")
    r = p.run(progress=False)
    assert r.lost == r.duplicated == 0 and len(got) == 8
    want = Npu("model").load(c).run(x)[0]
    assert all(np.array_equal(g, want) for g in got)
    used = set().union(*(j.engines_used for j in p.stages["plan"].jobs))
    assert used == {0, 1}  # two runner workers keep both engines busy


def _graph(tmp_path, stage: str) -> Path:
    """A graph around one stage; the source is any function of npu.* (resolved, never run)."""
    g = tmp_path / "g.yaml"
    g.write_text(
        "stages:\n  src: {source: 'npu.driver.pipeline.stages:check_workers'}\n"
        f"  work: {stage}\n"
        "queues:\n  q: {from: src, to: work}\n"
    )
    return g


@pytest.mark.parametrize(
    "stage, needle",
    [
        ("{fn: 'os:getpid', workers: 1000000000}", "workers 1000000000 is above the maximum of 64"),
        ("{fn: 'os:getpid', workers: 0}", "workers must be a positive integer, got 0"),
        ("{fn: 'os:getpid', processes: 'no'}", r"stages.work.processes: expected true or false, got 'no'"),
        ("{fn: 'os:getpid', ordered: 'yes'}", r"stages.work.ordered: expected true or false, got 'yes'"),
        ("{fn: 'os:getpid', ordered: 1}", r"stages.work.ordered: expected true or false, got 1"),
    ],
)
def test_graph_limits_and_strict_flags(tmp_path, stage, needle):
    with pytest.raises(PipelineError, match=needle):
        load_graph(_graph(tmp_path, stage), trust=True)


def test_graph_may_name_only_npu_and_its_own_folder_unless_trusted(tmp_path, capsys):
    from npu.cli import main

    g = _graph(tmp_path, "{fn: 'os:system'}")
    with pytest.raises(PipelineError, match=r"'os:system' is outside npu\.\* and the graph's folder"):
        load_graph(g)
    assert main(["pipeline", "check", str(g)]) != 0
    assert "--trust" in capsys.readouterr().err
    assert main(["pipeline", "check", str(g), "--trust"]) == 0  # checked, never run
    # a module next to the graph file is the graph's own code
    (tmp_path / "mystages_next_to_graph.py").write_text("def double(x):\n    return 2 * x\n")
    load_graph(_graph(tmp_path, "{fn: 'mystages_next_to_graph:double'}"))
