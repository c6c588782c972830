"""`npu demo` and `npu bench preempt` on the golden model (the RTL runs are the same code)."""

import json

from npu.cli import main


def test_demo_on_the_model(tmp_path, capsys):
    assert main(["demo", "--backend", "model", "--frames", "3", "--out", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr().out
    assert "latency, no preemption" in out and "identical to an uninterrupted run: True" in out
    for f in ("trace-preemptive.json", "trace-nonpreemptive.json", "timeline-preemptive.png", "demo.json"):
        assert (tmp_path / f).stat().st_size > 500, f
    d = json.loads((tmp_path / "demo.json").read_text())
    assert d["preemptive"]["mean_latency"] < d["nonpreemptive"]["mean_latency"]


def test_bench_preempt_json(capsys):
    assert main(["bench", "preempt", "--backend", "model", "--frames", "3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["scenario"]["reduction"] >= 0.15 and r["scenario"]["outputs_identical"]
    assert r["points_outputs_identical"]
    assert all(p["within_bound"] for p in r["points"])
    assert any(p["live_bytes"] > 0 for p in r["points"])
    assert r["max_pause_latency"] <= r["cp_interval"] + r["drain_bound"]
    s = r["strategies"]
    assert set(s) == {"no preemption", "spill points", "interval points", "naive checkpoint"}
    assert s["interval points"]["urgent_latency"] < s["no preemption"]["urgent_latency"]
    assert s["naive checkpoint"]["max_live_bytes"] > s["interval points"]["max_live_bytes"]
