"""The board tops in simulation: the host's driver talks to the simulated board through the UART and
runs compiled zoo models bit-exactly, one of them paused at a cancellation point and resumed
(sim/rtl/cocotb_board.py)."""

import numpy as np
import pytest

from npu.config import get_config
from npu.driver.demo import compile_zoo
from npu.driver.runtime import Npu
from npu.hdl.boards.boards import BOARDS
from npu.hdl.boards.top import SIM_DIVISOR
from npu.hdl.verilog import board_sim_verilog
from npu.sim.rtl.hdlsim import build_and_test

pytestmark = [pytest.mark.rtl, pytest.mark.xdist_group("rtl-board")]


@pytest.mark.parametrize("name", ["icebreaker", "ulx3s"])
def test_board_runs_zoo_models_and_a_pause_over_the_uart(name, tmp_path):
    board = BOARDS[name]
    cfg = get_config(board.preset)
    low, x_low = compile_zoo("digits_cnn", cfg.name, tmp_path, cp_interval=2000)
    urgent, x_urgent = compile_zoo("digits_mlp", cfg.name, tmp_path)
    assert low.manifest.cancel_points, "the low-priority model needs cancellation points"
    model = Npu("model", cfg)
    ref_low = model.load(low).run(x_low, int8=True)
    ref_urgent = model.load(urgent).run(x_urgent, int8=True)
    case = tmp_path / "case.npz"
    np.savez(case, x_low=x_low, x_urgent=x_urgent, **{f"ref_low{i}": r for i, r in enumerate(ref_low)},
             **{f"ref_urgent{i}": r for i, r in enumerate(ref_urgent)})  # fmt: skip
    low.save(tmp_path / "low.npub")
    urgent.save(tmp_path / "urgent.npub")
    v = board_sim_verilog(board, cfg)
    env = {
        "BOARD_CASE": str(case),
        "BOARD_CONFIG": cfg.name,
        "BOARD_LOW": str(tmp_path / "low.npub"),
        "BOARD_URGENT": str(tmp_path / "urgent.npub"),
        "BOARD_DRAM": board.dram,
        "BOARD_CLOCK_MHZ": str(board.clock_mhz),
        "BOARD_DIVISOR": str(SIM_DIVISOR),
    }
    build_and_test(
        v, "board_top", "npu.sim.rtl.cocotb_board", name=f"board-{name}", extra_env=env, quiet=True
    )


@pytest.mark.parametrize(
    ("name", "models", "config"),
    [
        ("ulx3s", ["digits_cnn", "planning"], None),
        # the keyword spotter: its depthwise and 1 x 1 layers as one operator (compiler/pointwise.py)
        ("ulx3s", ["ds_cnn_kws"], None),
        ("icebreaker", ["digits_mlp"], None),
        # the 128-MAC array on the same board: its 128-bit bus through the 16-bit SDRAM
        ("ulx3s", ["fc_autoencoder"], "ulx3s128"),
        # 128 MACs with A rows staged in the matrix unit (the 16-MAC preset's memories and bus)
        ("ulx3s", ["digits_cnn", "planning"], "ulx3s128s"),
    ],
)
def test_bench_board_cycles_match_the_golden_model(name, models, config, tmp_path):
    """`npu bench board`'s measurement on a board's top (SDRAM or SPRAM model, serial bridge):
    bit-exact outputs, and the golden model's cycles (the ULX3S's narrow-DRAM rule, the micro core's
    firmware costs) within 10 % of the board's."""
    from npu.sim.rtl.board_bench import bench_board, save_plot

    r = bench_board(name, models, probes=False, build_root=tmp_path, config=config)
    assert r["config"] == (config or BOARDS[name].preset)
    assert [m["name"] for m in r["models"]] == models
    assert r["achieved_mhz"] is None and r["models"][0]["latency_ms"] is None  # no build in tmp_path
    for m in r["models"]:
        assert m["bit_exact"], m
        assert m["cycles"] > 0 and abs(m["model_error"]) <= 0.10, m
        # the board moves at least this run's bytes through its DRAM: no faster than that floor
        assert m["utilization"] <= m["utilization_bound"]["run"] <= m["utilization_bound"]["weights_io"], m
        # each unit's busy cycles on the board beside the model's (the micro core runs them in turn)
        assert set(m["units"]) >= {"load", "matrix", "vector", "store"}, m
        assert m["units"]["matrix"]["cycles"] > 0 and m["units"]["matrix"]["model_cycles"] > 0, m
    save_plot([r], tmp_path / "latency.png")  # --plot: at the nominal clock without a build
    assert (tmp_path / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_board_quotes_the_build_of_the_configuration_it_runs(tmp_path):
    """A `--config` preset built with `-o build/boards/<config>` (docs/boards.md): the bench quotes
    that build's Fmax, not the board's own build of another configuration (which it quotes, with a
    warning, only when the preset has no build of its own)."""
    import json

    from npu.config import get_config
    from npu.sim.rtl.board_bench import _last_build

    own, c32 = get_config("ulx3s"), get_config("ulx3s32")
    for d, cfg, mhz in (("ulx3s", own, 53.0), ("ulx3s32", c32, 51.0)):
        (tmp_path / d).mkdir()
        report = {"config_id": f"{cfg.config_id:#010x}", "fmax": {"clk": {"achieved_mhz": mhz}}}
        (tmp_path / d / "build_report.json").write_text(json.dumps(report))
    assert _last_build("ulx3s", tmp_path, c32)[0]["fmax"]["clk"]["achieved_mhz"] == 51.0
    assert _last_build("ulx3s", tmp_path, own)[0]["fmax"]["clk"]["achieved_mhz"] == 53.0
    report, path = _last_build("ulx3s", tmp_path, get_config("ulx3s128"))  # no build of its own
    assert path.parent.name == "ulx3s" and report["fmax"]["clk"]["achieved_mhz"] == 53.0


def test_micro_costs_are_the_fit_of_the_firmware_on_the_rtl(tmp_path):
    """npu.timing's micro-core costs are what the probe programs measure on the iCEBreaker's top
    now (a firmware change that moves them fails here: refit with `python -m npu.sim.rtl.probes`)."""
    from npu.config import get_config
    from npu.sim.rtl.board_bench import bench_board
    from npu.sim.rtl.probes import fit_micro
    from npu.timing import MICRO_COSTS, MICRO_MARKER, MICRO_OTHER, MICRO_RUN

    r = bench_board("icebreaker", [], build_root=tmp_path)
    assert all(p["model_error"] is not None for p in r["probes"])
    fit = fit_micro({p["probe"]: p["cycles"] for p in r["probes"]}, get_config("icebreaker"))
    assert fit["MICRO_RUN"] == MICRO_RUN and abs(fit["MICRO_OTHER"] - MICRO_OTHER) <= 2
    assert abs(fit["MICRO_MARKER"] - MICRO_MARKER) <= 2
    for op, costs in MICRO_COSTS.items():
        for k, v in costs.items():
            assert fit["MICRO_COSTS"][op.name][k] == pytest.approx(v, rel=0.01, abs=1.0), (op.name, k)
