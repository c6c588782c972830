"""`npu profile` and `npu bench opqueue` as a user runs them (small sizes)."""

import json

import numpy as np
import onnx

from npu.cli import main
from npu.container import Container, NpuSegment
from npu.driver.sched.bench import bench_opqueue, format_opqueue, poisson_arrivals
from npu.models import zoo


def test_profile_command_writes_reference_runtimes(tmp_path, capsys):
    z = zoo.planning()
    onnx.save(z.model, str(tmp_path / "p.onnx"))
    np.save(tmp_path / "c.npy", z.calib)
    npub = tmp_path / "p.npub"
    assert main(["compile", str(tmp_path / "p.onnx"), "--calib", str(tmp_path / "c.npy"),
                 "--granularity", "operator", "-o", str(npub)]) == 0  # fmt: skip
    assert all(s.ref_cycles is None for s in Container.load(npub).manifest.segments)
    capsys.readouterr()
    assert main(["profile", str(npub), "--json", "-o", str(tmp_path / "q.npub")]) == 0
    rep = json.loads(capsys.readouterr().out)
    segs = Container.load(tmp_path / "q.npub").manifest.segments
    assert [r["ref_cycles"] for r in rep["segments"]] == [s.ref_cycles for s in segs]
    assert all(isinstance(s, NpuSegment) and s.ref_cycles > 0 for s in segs)
    assert main(["profile", str(tmp_path / "none.npub")]) == 2
    assert "none.npub: no such file" in capsys.readouterr().err


def test_poisson_arrivals_offer_the_asked_load():
    class A:
        def __init__(self, w):
            self.work = w

    apps = [A(1000), A(10), A(500)]
    arr = poisson_arrivals(apps, 2, 0.5, 2000, seed=3)
    assert len(arr) == 6000 and arr == sorted(arr)
    span = max(t for t, _ in arr)
    offered = 2000 * sum(a.work for a in apps) / span / 2
    assert 0.45 < offered < 0.55
    assert poisson_arrivals(apps, 2, 0.5, 10, seed=3) == poisson_arrivals(apps, 2, 0.5, 10, seed=3)


def test_bench_opqueue_figures_are_consistent(tmp_path):
    r = bench_opqueue("default", engines=(2,), loads=(0.8,), jobs=6, cache=tmp_path)
    assert {a["name"] for a in r["apps"]} == {"longconv", "planning", "multipath"}
    ops = {a["name"]: a for a in r["apps"]}
    longest_other = max(a["op_cycles_max"] for n, a in ops.items() if n != "longconv")
    assert ops["longconv"]["op_cycles_max"] >= 10 * longest_other  # the seed: 10x apart
    # many short operators carrying a share of the load comparable to the long one's
    assert ops["multipath"]["ops"] >= 8
    assert ops["multipath"]["job_cycles"] >= ops["longconv"]["job_cycles"] / 2
    assert {x["policy"] for x in r["runs"]} == {"expected-time", "count", "round-robin"}
    for x in r["runs"]:
        assert x["engines"] == 2 and x["backend"] == "model" and len(x["engine_utilization"]) == 2
        assert all(0 < u <= 1 for u in x["engine_utilization"]) and x["imbalance"] >= 1
        assert all(a["p99_latency"] >= a["mean_latency"] > 0 for a in x["apps"])
    assert len(r["p99_cut"]) == 1
    assert r["instances_per_engine"] == 1
    s = r["scaling"]["engines"]
    assert s["1"]["speedup"] == 1 and s["4"]["speedup"] > s["2"]["speedup"] > 1
    json.dumps(r)


def test_bench_opqueue_over_several_seeds_reports_each_cut_and_their_mean(tmp_path):
    r = bench_opqueue("default", engines=(2,), loads=(0.8,), policies=("expected-time", "count"), jobs=4,
                      seed=3, seeds=2, cache=tmp_path)  # fmt: skip
    assert r["seeds"] == [3, 4] and {x["seed"] for x in r["runs"]} == {3, 4}
    (m,) = r["p99_cut_mean"]
    assert len(m["cuts"]) == 2 and m["cuts"][0] == r["p99_cut"][0]["cut"]
    assert m["cut"] == round(sum(m["cuts"]) / 2, 4)
    assert "mean over seeds 3-4" in format_opqueue(r)
