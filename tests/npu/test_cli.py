import json

import numpy as np
import pytest

from npu.cli import main
from npu.config import get_config

EX = "examples/gemm_requant_relu.s"


def test_asm_disasm_roundtrip(tmp_path, capsys):
    out = tmp_path / "g.bin"
    assert main(["asm", EX, "-o", str(out)]) == 0
    assert out.stat().st_size % 32 == 0
    capsys.readouterr()
    assert main(["disasm", str(out)]) == 0
    text = capsys.readouterr().out
    src = tmp_path / "again.s"
    src.write_text(text)
    again = tmp_path / "again.bin"
    assert main(["asm", str(src), "-o", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()


def test_run_prints_result_and_cycles(capsys):
    assert main(["run", EX]) == 0
    out = capsys.readouterr().out
    assert "status: DONE" in out and "C: int8 192x128" in out and "cycles" in out


def test_run_json_with_pauses_and_saved_outputs(tmp_path, capsys):
    assert main(["run", EX, "--json", "--save", str(tmp_path / "o.npz")]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["run", EX, "--json", "--pause-at", "0", "--pause-at", "1"]) == 0
    paused = json.loads(capsys.readouterr().out)
    assert len(paused["pauses"]) == 2
    assert paused["outputs"] == plain["outputs"]
    assert np.array_equal(np.load(tmp_path / "o.npz")["C"], np.array(plain["outputs"]["C"], np.int8))


def test_run_binary_with_dram_and_output_flags(tmp_path, capsys):
    src = tmp_path / "copy.s"
    src.write_text(
        "load spad=0 dram=0x1000 rows=1 cols=8 spad_stride=8 dram_stride=8 signal=store\n"
        "store spad=0 dram=0x2000 rows=1 cols=8 spad_stride=8 dram_stride=8 wait=load\nend\n"
    )
    np.save(tmp_path / "x.npy", np.arange(8, dtype=np.int8))
    assert main(["asm", str(src), "-o", str(tmp_path / "copy.bin")]) == 0
    assert (
        main(
            [
                "run",
                str(tmp_path / "copy.bin"),
                "--config",
                "tiny",
                "--json",
                "--dram",
                f"{tmp_path / 'x.npy'}@0x1000",
                "--output",
                "y@0x2000:i8:8",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert res["outputs"]["y"] == list(range(8))


def test_bench_model_json(capsys):
    assert main(["bench", "model", "--json", "--size", "128"]) == 0
    r = json.loads(capsys.readouterr().out)
    g = r["gemm"]
    for key in ("m", "n", "k", "wall_s", "cycles", "ideal_cycles", "utilization"):
        assert key in g
    assert g["cycles"] >= g["ideal_cycles"] == 128**3 / 128
    assert g["bit_exact"] and 0 < g["utilization"] <= 1
    assert r["sim_cycles_per_s"] > 0


def test_bench_banks_json(capsys):
    assert main(["bench", "banks", "--models", "digits_cnn", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    progs = {p["program"]: p for p in r["programs"]}
    assert set(progs) == {"digits_cnn", "gemm 256^3"}
    assert progs["gemm 256^3"]["steps"] == 256**3 // get_config("default").macs_per_cycle
    for p in progs.values():
        assert p["matmuls"] > 0
        for m in p["mappings"].values():
            assert m["slowdown"] >= 1.0 and m["cycles"] >= p["steps"]


def test_bench_models_json(capsys):
    """Each model's figures (the zoo's small ones here; the real-model set is the default run):
    utilisation is the NPU's MACs over golden-model cycles times the MACs a cycle."""
    assert main(["bench", "models", "--models", "perception", "digits_cnn", "--inputs", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    keys = {"name", "set", "macs", "cycles", "predicted_cycles", "utilization", "int8_mac_share", "cosine",
            "compile_s", "max_cp_gap", "cp_cycles_added", "accuracy_check", "quantisation"}  # fmt: skip
    peak = get_config("default").macs_per_cycle
    for m in r["models"]:
        assert keys <= set(m) and m["set"] == "zoo", m
        assert 0 < m["utilization"] <= 1 and m["utilization"] == round(m["macs"] / (m["cycles"] * peak), 4)
        assert m["cosine"] >= 0.99 and m["accuracy_check"] == "passed"
        assert 0 <= m["int8_mac_share"] <= 1
        if m["quantisation"].startswith("int16 activations"):
            assert m["int8_mac_share"] == 0.0, m
        if m["quantisation"].startswith("mixed activations") and "0 int16" in m["quantisation"]:
            assert m["int8_mac_share"] == 1.0, m
        assert 0 < m["max_cp_gap"] <= 100_000  # the default pause budget (500 us at 100 MHz)
        assert 0 <= m["cp_cycles_added"] < m["cycles"]  # the points' cost, measured (an interval)
    assert [m["name"] for m in r["models"]] == ["perception", "digits_cnn"]


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["bench", "models", "--models", "alexnet"], "unknown model 'alexnet'"),
        (["run", "nope.s"], "no such file"),
        (["run", EX, "--config", "huge"], "unknown configuration 'huge'"),
        (["compile", "m.onnx"], "m.onnx: no such file"),
        (["demo", "--config", "huge"], "unknown configuration 'huge'"),
        (["bench", "banks", "--models", "alexnet"], "unknown zoo model 'alexnet'"),
        (["bench", "order", "--models", "alexnet"], "unknown zoo model 'alexnet'"),
    ],
)
def test_clear_errors(argv, msg, capsys):
    assert main(argv) == 2
    assert msg in capsys.readouterr().err


def test_asm_error_has_line_number(tmp_path, capsys):
    bad = tmp_path / "bad.s"
    bad.write_text("end\nload rows=1 colz=2\n")
    assert main(["asm", str(bad)]) == 2
    assert f"{bad}:2:" in capsys.readouterr().err


def test_asm_checks_config_rules(tmp_path, capsys):
    bad = tmp_path / "bad.s"
    bad.write_text(".config tiny\nload spad=0x7ffff rows=1 cols=2\nend\n")
    assert main(["asm", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2:" in err and "SPAD_RANGE" in err


def test_run_reports_device_error(tmp_path, capsys):
    src = tmp_path / "dead.s"
    src.write_text("matmul c=0x80000 m=1 n=1 k=4 wait=load\nend\n")
    assert main(["run", str(src), "--config", "tiny"]) == 1
    assert "DEADLOCK" in capsys.readouterr().out
