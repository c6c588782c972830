"""`npu regress`: the random-program regression in shards, on local processes and on Ray; results
cached by the digest of their inputs, failures reported by seed (replayable), errors never dropped."""

import dataclasses
import json

import pytest

from npu.cli import main

pytestmark = [pytest.mark.rtl, pytest.mark.xdist_group("rtl-tiny")]  # the tiny sim top, built once


def _run(capsys, *args) -> tuple[int, dict]:
    code = main(["regress", "--config", "tiny", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_local_shards_agree_and_a_rerun_comes_from_the_cache(tmp_path, capsys):
    args = ["--programs", "6", "--shard-size", "3", "--engine", "local", "--workers", "1"]
    args += ["--cache", str(tmp_path)]
    code, r = _run(capsys, *args)
    assert code == 0 and r["programs"] == 6 and r["failures"] == [] and r["errors"] == []
    assert r["shards"] == 2 and r["shards_cached"] == 0 and r["programs_per_s"] > 0 and r["cycles"] > 0
    code, again = _run(capsys, *args)
    assert code == 0 and again["shards_cached"] == 2 and again["programs"] == 6
    assert again["cycles"] == r["cycles"]


def test_a_disagreeing_program_is_reported_by_its_seed(tmp_path, capsys, monkeypatch):
    """The model's result of one seed is made to differ: that seed, and only it, is a failure."""
    from npu.sim.rtl import core

    real = core.run_model

    def wrong_for_one(cfg, job):
        rec = real(cfg, job)
        if job.name.startswith("seed1000004-"):
            rec = dataclasses.replace(rec, dram=bytes([rec.dram[0] ^ 1]) + rec.dram[1:])
        return rec

    monkeypatch.setattr(core, "run_model", wrong_for_one)  # the workers are forked: they see it
    code, r = _run(capsys, "--programs", "6", "--shard-size", "3", "--engine", "local", "--workers", "1",
                   "--cache", str(tmp_path))  # fmt: skip
    assert code == 1 and r["failures"] == [1000004] and "DRAM differs" in r["failure_details"][0]["differs"]
    main(["regress", "--config", "tiny", "--programs", "6", "--shard-size", "3", "--engine", "local",
          "--cache", str(tmp_path), "--workers", "1"])  # fmt: skip
    assert "npu hdl replay --config tiny --seed 1000004" in capsys.readouterr().out


def test_shards_on_a_local_ray_instance(tmp_path, capsys):
    pytest.importorskip("ray", reason="the cluster extra is not installed")
    code, r = _run(capsys, "--programs", "4", "--shard-size", "2", "--engine", "ray", "--workers", "1",
                   "--cache", str(tmp_path))  # fmt: skip
    assert code == 0 and r["engine"] == "ray" and r["programs"] == 4 and r["failures"] == []


def test_regress_errors(capsys):
    assert main(["regress", "--engine", "local", "--address", "10.0.0.1:6379"]) == 2
    assert "--address needs Ray" in capsys.readouterr().err
    assert main(["regress", "--config", "nosuch", "--engine", "local"]) == 2
    assert "nosuch" in capsys.readouterr().err
