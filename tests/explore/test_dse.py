"""`npu dse`: the design space, the Pareto front, the model list, the cache and the CLI's errors (local
processes; the Ray cluster runs are in test_cluster.py)."""

import json

import numpy as np
import onnx
import pytest

from npu.cli import main
from npu.config import get_config
from npu.explore import dse


def test_parameters_parse_and_bad_ones_are_named():
    assert dse.parse_param("array=4x2x8, 1x2x8") == ("array", ((4, 2, 8), (1, 2, 8)))
    assert dse.parse_param("spad_bytes=64K,1M,64K") == ("spad_bytes", (65536, 1 << 20))
    with pytest.raises(dse.DseError, match="unknown parameter 'lanez'"):
        dse.parse_param("lanez=8")
    with pytest.raises(dse.DseError, match="CxPxL"):
        dse.parse_param("array=4x2")
    with pytest.raises(dse.DseError, match="whole number"):
        dse.parse_param("acc_bytes=12Q")
    with pytest.raises(dse.DseError, match="NAME=V1"):
        dse.parse_param("queue_depth")


def test_the_int16_rate_is_a_switch_of_the_space():
    assert dse.parse_param("a16_full_rate=on,off,on") == ("a16_full_rate", (True, False))
    with pytest.raises(dse.DseError, match="a16_full_rate='half': expected on or off"):
        dse.parse_param("a16_full_rate=half")
    base = get_config("default")
    pts = dse.grid(base, {"a16_full_rate": (True, False)})
    assert [p.label for p in pts] == ["(the base)", "a16_full_rate=off"]  # on is the base itself
    assert pts[1].config.a16_full_rate is False and pts[1].config.config_id != base.config_id
    bad = dse.grid(get_config("icebreaker"), {"a16_full_rate": (True,)})[1]
    assert bad.config is None and "micro core" in bad.error


def test_the_grid_keeps_invalid_points_with_their_reason_and_the_base_once():
    base = get_config("ulx3s")
    pts = dse.grid(base, {"array": ((1, 2, 8), (1, 4, 8)), "vector_lanes": (2, 16)})
    assert pts[0].changes == {} and pts[0].config.config_id == base.config_id
    # 1x2x8 with 2 vector lanes is the base again: not evaluated twice
    assert [p.label for p in pts[1:]] == ["array=1x2x8 vector_lanes=16", "array=1x4x8 vector_lanes=2",
                                          "array=1x4x8 vector_lanes=16"]  # fmt: skip
    bad = [p for p in pts if p.config is None]
    assert len(bad) == 2 and all("vector_lanes=16" in p.error for p in bad)
    wide = pts[2].config  # a 4-PE array: a 128-bit bus and, banked, enough banks for it
    assert (wide.pes_per_cluster, wide.bus_bytes, wide.macs_per_cycle) == (4, 16, 32)
    assert wide.spad_banks >= 2 * 4
    sample = dse.grid(base, dse.default_space(base), sample=5, seed=3)
    assert len(sample) == 6 and sample == dse.grid(base, dse.default_space(base), sample=5, seed=3)
    assert len(dse.grid(base, dse.default_space(base))) >= 24


def test_pareto_front():
    rows = [{"a": 1, "b": 5}, {"a": 2, "b": 2}, {"a": 3, "b": 3}, {"a": 1, "b": 5}, {"a": None, "b": 0}]
    assert dse.pareto(rows, ("a", "b")) == [0, 3, 1]  # equal rows both stay; (3, 3) is dominated
    assert dse.fits({"lut": 10, "dsp": 3}, {"lut": 10, "dsp": 2}) is False
    assert dse.fits({"lut": 10, "dsp": 2}, {"lut": 10, "dsp": 2}) is True


def test_a_small_exploration_with_a_file_model_and_its_cache(tmp_path, capsys, monkeypatch):
    from npu.models import zoo

    z = zoo.digits_mlp()
    onnx.save(z.model, str(tmp_path / "mlp.onnx"))
    np.save(tmp_path / "calib.npy", z.calib)
    args = ["dse", "--models", f"digits_cnn,{tmp_path / 'mlp.onnx'}:{tmp_path / 'calib.npy'}",
            "--param", "array=1x2x8,1x4x8", "--synth", "0", "--engine", "local", "--workers", "1",
            "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache"), "--json"]  # fmt: skip
    assert main(args) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["models"] == ["digits_cnn", "mlp"] and r["errors"] == [] and not r["interrupted"]
    base, wide = r["points"]
    assert base["base"] and wide["label"] == "array=1x4x8" and wide["macs_per_cycle"] == 32
    for p in (base, wide):
        for m in ("digits_cnn", "mlp"):
            res = p["models"][m]
            assert res["cycles"] > 0 and 0 < res["utilization"] <= 1
            assert res["latency_us"] == pytest.approx(res["cycles"] / 50.0, abs=1e-3)
    # a wider array does not run these models slower; on the front, fastest first
    assert wide["latency_us"] < base["latency_us"] and r["proxy_front"][0] == "array=1x4x8"
    assert (tmp_path / "out" / "front.png").stat().st_size > 0
    assert json.loads((tmp_path / "out" / "dse.json").read_text())["points"] == r["points"]

    def no_runs(task):
        raise AssertionError("every result is in the cache")

    monkeypatch.setattr(dse, "evaluate", no_runs)
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["points"] == r["points"]


def test_a_model_that_does_not_fit_is_a_result_not_a_crash(tmp_path, capsys):
    args = ["dse", "--models", "digits_cnn", "--param", "spad_bytes=1K", "--param", "acc_bytes=256",
            "--synth", "0", "--engine", "local", "--workers", "1", "--no-cache", "--out", str(tmp_path),
            "--json"]  # fmt: skip
    assert main(args) == 0
    pts = json.loads(capsys.readouterr().out)["points"]
    small = pts[1]
    assert small["latency_us"] is None and "no tiling fits the 1024-byte scratchpad" in small["error"]
    assert "error" in small["models"]["digits_cnn"] and pts[0]["latency_us"] > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--models", "nosuch"], "not in the zoo"),
        (["--models", "x.onnx"], "needs its calibration"),
        (["--models", "digits_mlp,digits_mlp"], "names a model twice"),
        (["--param", "lanez=2"], "unknown parameter"),
        (["--pnr", "1"], "--pnr needs --board"),
        (["--board", "nosuch"], "unknown board"),
        (["--models", "/nonexistent/m.onnx:c.npy"], "/nonexistent/m.onnx"),
    ],
)
def test_bad_input_is_a_clear_error(args, message, capsys):
    assert main(["dse", "--engine", "local", *args]) == 2
    assert message in capsys.readouterr().err


def test_a_multi_port_base_is_explored_without_synthesis(tmp_path, capsys):
    """The `default` preset's multi-port scratchpad is not an FPGA design: its points are evaluated,
    synthesis is left out with the reason, and the run succeeds."""
    args = ["dse", "--config", "default", "--models", "digits_mlp", "--param", "queue_depth=4",
            "--synth", "2", "--engine", "local", "--workers", "1", "--no-cache", "--out", str(tmp_path),
            "--json"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr()
    r = json.loads(out.out)
    assert "synthesis left out: default has a multi-port scratchpad" in out.err
    assert len(r["points"]) == 2 and all("resources" not in p for p in r["points"]) and "best" not in r


def test_ctrl_c_keeps_the_finished_results(tmp_path, capsys, monkeypatch):
    """Ctrl-C after the first result: the command exits 130, writes what finished (marked interrupted)
    and keeps it in the cache, so the next run only runs the rest."""
    from npu.cli import workers

    def one_then_ctrl_c(fn, items, args):
        items = list(items)
        yield items[0], fn(items[0])
        raise KeyboardInterrupt

    monkeypatch.setattr(workers, "run_tasks", one_then_ctrl_c)
    args = ["dse", "--models", "digits_mlp", "--param", "array=1x2x8,1x4x8", "--synth", "0",
            "--engine", "local", "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out"),
            "--json"]  # fmt: skip
    assert main(args) == 130
    r = json.loads(capsys.readouterr().out)
    assert r["interrupted"] and sum(len(p.get("models", {})) for p in r["points"]) == 1
    assert json.loads((tmp_path / "out" / "dse.json").read_text())["interrupted"]
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
    monkeypatch.undo()
    assert main(args) == 0
    r = json.loads(capsys.readouterr().out)
    assert not r["interrupted"] and all(p["latency_us"] for p in r["points"])


def _fixed_synthesis(task):  # module-level: the workers get it by reference
    dsp = 200 if task.config.pes_per_cluster == 4 else 60
    return {"lut": 30_000, "ff": 10_000, "bram": 40, "dsp": dsp, "lutram": 300, "cells": {}, "seconds": 1.0}


def _fixed_build(task):
    return {
        "achieved_mhz": 40.0,
        "timing_met": False,
        "resources": {},
        "build_seconds": 1.0,
        "bitstream": None,
    }


def test_synthesis_and_place_and_route_choose_the_fastest_point_that_fits(tmp_path, capsys, monkeypatch):
    """The front's synthesis and the board builds, with the tools replaced by fixed figures (the real
    ones take minutes each; `npu build` and core_resources are tested with the board flow): the
    1x4x8 point is over the board's DSP budget here, so the base is the best that fits and is built."""

    monkeypatch.setattr(dse, "synthesize", _fixed_synthesis)
    monkeypatch.setattr(dse, "place_and_route", _fixed_build)
    args = ["dse", "--board", "ulx3s", "--models", "digits_mlp", "--param", "array=2x2x8,2x4x8",
            "--synth", "2", "--pnr", "1", "--engine", "local", "--workers", "1", "--no-cache",
            "--out", str(tmp_path), "--json"]  # fmt: skip
    assert main(args) == 0
    r = json.loads(capsys.readouterr().out)
    base, wide = r["points"]  # the board's preset is 2x2x8 (`ulx3s32`)
    assert wide["fits"] is False and base["fits"] is True and r["best"] == "(the base)"
    assert wide["resources"]["dsp"] == 200 and r["front"] == ["array=2x4x8", "(the base)"]
    assert "pnr" not in wide and base["pnr"]["achieved_mhz"] == 40.0
    assert base["pnr"]["latency_us"] == pytest.approx(base["latency_us"] * 50 / 40, rel=1e-3)


def _broken_evaluate(task):
    raise RuntimeError("a bug in the task")


def test_failing_tasks_are_reported_and_the_run_still_writes_its_output(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(dse, "evaluate", _broken_evaluate)
    args = ["dse", "--models", "digits_mlp", "--param", "array=1x2x8,1x4x8", "--synth", "0",
            "--engine", "local", "--workers", "1", "--no-cache", "--out", str(tmp_path),
            "--json"]  # fmt: skip
    assert main(args) == 1
    r = json.loads(capsys.readouterr().out)
    assert len(r["errors"]) == 2 and all("a bug in the task" in e["error"] for e in r["errors"])
    assert all(p["latency_us"] is None for p in r["points"]) and (tmp_path / "front.png").exists()
