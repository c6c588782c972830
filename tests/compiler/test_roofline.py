"""The roofline's floors are lower bounds: no run of the golden model beats them."""

import json

import pytest

from npu.cli import main
from npu.config import get_config
from npu.timing import dram_floor_cycles


def test_dram_floor_narrow_and_wide():
    """A shared narrow DRAM adds reads and writes at its word a cycle; a wide one overlaps them."""
    narrow, wide = get_config("ulx3s"), get_config("default")
    assert dram_floor_cycles(narrow, 1000, 501) == 751  # 2 bytes a cycle, rounded up
    assert dram_floor_cycles(wide, 1600, 320) == 100  # 16-byte reads; writes on their own channel
    assert dram_floor_cycles(wide, 16, 3200) == 200


@pytest.mark.parametrize("config", ["ulx3s", "default"])
def test_bench_roofline_bounds_hold(config, capsys):
    """Per model: the golden model's cycles are at least the compute floor and this run's memory
    floor, its utilisation at most every bound, the floors ordered as the traffic they count."""
    argv = ["bench", "roofline", "--config", config, "--models", "digits_cnn", "planning", "--json"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    cfg = get_config(config)
    assert r["config"] == config and r["macs_per_cycle"] == cfg.macs_per_cycle
    assert [m["name"] for m in r["models"]] == ["digits_cnn", "planning"]
    for m in r["models"]:
        b, f, moved = m["bytes"], m["memory_floor_cycles"], m["utilization_bound"]
        assert m["cycles"] >= m["compute_cycles"] == -(-m["macs"] // cfg.macs_per_cycle)
        assert m["cycles"] >= f["run"] >= 1, m
        assert f["weights_io"] <= f["program"], m
        # every constant image and input is loaded, every output stored, at least once
        assert b["dma_read"] >= b["constants"] + b["inputs"] and b["dma_write"] >= b["outputs"], m
        assert f["program"] <= f["run"], m
        assert m["utilization"] <= moved["run"] <= moved["program"] <= moved["weights_io"] <= 1, m
        assert b["program"] == 32 * m["instructions"]  # straight-line: each fetched once


def test_bench_roofline_unknown_model(capsys):
    assert main(["bench", "roofline", "--models", "no_such_model"]) != 0
    assert "no_such_model" in capsys.readouterr().err
