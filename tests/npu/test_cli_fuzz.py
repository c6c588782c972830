"""Every subcommand fed bad paths, directories, empty, binary and non-UTF-8 files and out-of-range
numbers: always `npu: error: ...` naming the problem with exit code 2 (1 for a failed job), never a
traceback."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npu.cli import main
from npu.compiler import compile_onnx
from npu.models.builder import Net

EX = "examples/gemm_requant_relu.s"
ERROR = re.compile(r"^npu( [a-z]+)*: error: \S", re.M)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    net = Net("mlp", (1, 32), seed=4)
    onnx.save(net.model([net.gemm(net.relu(net.gemm(net.input, 32)), 8)]), str(d / "mlp.onnx"))
    calib = np.random.default_rng(1).normal(size=(16, 32)).astype(np.float32)
    c_mlp = compile_onnx(d / "mlp.onnx", "tiny", calib=calib).to_container()
    x_mlp = calib[:1]
    f = {"dir": d / "a_dir", "missing": d / "missing.s", "empty": d / "empty.s"}
    f["dir"].mkdir()
    f["empty"].write_text("")
    (d / "binary.s").write_bytes(bytes(range(256)) * 4)
    f["binary"] = d / "binary.s"
    (d / "latin1.s").write_bytes("; caf\xe9\nend\n".encode("latin-1"))
    f["latin1"] = d / "latin1.s"
    (d / "odd.bin").write_bytes(b"\x01" * 33)
    f["odd"] = d / "odd.bin"
    (d / "huge.s").write_text(".data 0x0 random i8 100000x100000\nend\n")  # 10 GB: refused before it is built
    f["huge"] = d / "huge.s"
    (d / "junk.npub").write_bytes(b"NPUB" + bytes(100))
    f["junk_npub"] = d / "junk.npub"
    (d / "junk.onnx").write_bytes(b"\x08\x01garbage" * 10)
    f["junk_onnx"] = d / "junk.onnx"
    f["mlp_onnx"] = d / "mlp.onnx"
    f["mlp"] = d / "mlp.npub"
    c_mlp.save(f["mlp"])
    for name, arr in {
        "x": x_mlp,
        "x_nan": np.full_like(x_mlp, np.nan),
        "x_shape": np.zeros((3, 5), np.float32),
        "x_str": np.array(["a", "b"]),
        "c8": np.random.default_rng(0).normal(size=(4, 1, 8)).astype(np.float32),
        "c_nan": np.full((4, 32), np.nan, np.float32),
        "c_rank": np.zeros((4, 1, 32), np.float32),
    }.items():
        np.save(d / f"{name}.npy", arr)
        f[name] = d / f"{name}.npy"
    (d / "notnpy.npy").write_bytes(b"nope")
    f["notnpy"] = d / "notnpy.npy"
    # models the compiler must refuse by name: a custom-domain operator, a size-0 tensor, int64 input
    for name, op, domain, elem, shape in [
        ("custom", "Magic", "com.example", TensorProto.FLOAT, [1, 8]),
        ("zero", "Relu", "", TensorProto.FLOAT, [1, 0]),
        ("int", "Relu", "", TensorProto.INT64, [1, 8]),
    ]:
        io = [helper.make_tensor_value_info(n, elem, shape) for n in ("x", "y")]
        node = helper.make_node(op, ["x"], ["y"], name=f"{op.lower()}0", domain=domain)
        opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
        onnx.save(helper.make_model(helper.make_graph([node], "g", io[:1], io[1:]), opset_imports=opsets),
                  d / f"{name}.onnx")  # fmt: skip
        f[name] = d / f"{name}.onnx"
    return {k: str(v) for k, v in f.items()}


CASES = [
    # asm
    ["asm", "{missing}"], ["asm", "{dir}"], ["asm", "{empty}"], ["asm", "{binary}"], ["asm", "{latin1}"],
    ["asm", EX, "-o", "{dir}"], ["asm", EX, "-o", "{dir}/no/such/x.bin"], ["asm", EX, "--config", "nope"],
    # disasm
    ["disasm", "{missing}"], ["disasm", "{dir}"], ["disasm", "{odd}"], ["disasm", "{junk_npub}"],
    ["disasm", "{latin1}"], ["disasm", "{binary}"],
    # run
    ["run", "{missing}"], ["run", "{dir}"], ["run", "{huge}"], ["run", "{latin1}"], ["run", "{binary}"],
    ["run", EX, "--base", "0x10000000000"], ["run", EX, "--base", "-1"], ["run", EX, "--base", "0x123"],
    ["run", EX, "--max-cycles", "-5"], ["run", EX, "--pause-at", "-1"], ["run", EX, "--config", "nope"],
    ["run", EX, "--dram", "{missing}@0"], ["run", EX, "--dram", "{x}@0x7fffffff00"],
    ["run", EX, "--dram", "{dir}@0"], ["run", EX, "--output", "C@zz:i8:4"], ["run", EX, "--save", "{dir}"],
    ["run", "{junk_npub}", "--input", "{x}"], ["run", "{mlp}"], ["run", "{mlp}", "--input", "{missing}"],
    ["run", "{mlp}", "--input", "{dir}"], ["run", "{mlp}", "--input", "{x_nan}"],
    ["run", "{mlp}", "--input", "{x_shape}"], ["run", "{mlp}", "--input", "{x_str}"],
    ["run", "{mlp}", "--input", "{notnpy}"], ["run", "{mlp}", "--input", "{x}", "--output", "{dir}"],
    ["run", "{mlp}", "--input", "{x}", "--config", "default"],
    # compile
    ["compile", "{missing}"], ["compile", "{dir}"], ["compile", "{empty}"], ["compile", "{junk_onnx}"],
    ["compile", "{custom}", "--calib", "{c8}", "-o", "{dir}/c.npub"],
    ["compile", "{zero}", "--calib", "{c8}", "-o", "{dir}/z.npub"],
    ["compile", "{int}", "--calib", "{c8}", "-o", "{dir}/i.npub"],
    ["compile", "{custom}", "--config", "nope"],
    ["compile", "{mlp_onnx}", "--calib", "{missing}"], ["compile", "{mlp_onnx}", "--calib", "{notnpy}"],
    ["compile", "{mlp_onnx}", "--calib", "{dir}"], ["compile", "{mlp_onnx}", "--calib", "{x_str}"],
    ["compile", "{mlp_onnx}", "--calib", "{x_shape}"], ["compile", "{mlp_onnx}", "--calib", "{c_rank}"],
    ["compile", "{mlp_onnx}", "--calib", "{c_nan}"], ["compile", "{mlp_onnx}", "--calib", "{c8}"],
    ["compile", "{mlp_onnx}", "--calib", "{x}", "-o", "{dir}"],
    ["compile", "{custom}", "--cp-interval", "-3"],
    # hdl, config, bench, demo
    ["hdl", "verilog", "--config", "nope"], ["hdl", "verilog", "--config", "tiny", "-o", "{dir}"],
    ["hdl", "replay", "--seed", "-1"], ["hdl", "replay", "--seed", "1", "--config", "nope"],
    ["config", "nope"], ["bench", "nope"], ["bench", "model", "--size", "0"],
    ["bench", "gemm", "--sizes", "-64"], ["bench", "preempt", "--frames", "0"],
    ["bench", "order", "--models", "nope"], ["bench", "model", "--config", "nope"],
    ["demo", "--frames", "0"], ["demo", "--period-ms", "-1"], ["demo", "--cp-interval", "0"],
    ["demo", "--config", "nope"],
]  # fmt: skip


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(c) for c in CASES])
def test_bad_input_is_an_error_message_never_a_traceback(argv, files, capsys):
    args = [a.format(**files) for a in argv]
    try:
        rc = main(args)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc in (1, 2), (args, rc, err)
    assert ERROR.search(err), (args, err)
    assert "Traceback" not in err and "internal error" not in err, err


def test_messages_name_the_problem(files, capsys):
    for argv, words in [
        (["compile", "{custom}", "--calib", "{c8}"], ["magic0", "com.example.Magic"]),
        (["compile", "{zero}", "--calib", "{c8}"], ["'x'", "size 0"]),
        (["compile", "{int}", "--calib", "{c8}"], ["'x'", "int64"]),
        (["compile", "{mlp_onnx}", "--calib", "{c_nan}"], ["NaN", "'input'"]),
        (["compile", "{mlp_onnx}", "--calib", "{c_rank}"], ["shape [4, 1, 32]", "[1, 32]"]),
        (["run", "{mlp}", "--input", "{x_nan}"], ["NaN", "input"]),
        (["run", EX, "--base", "0x123"], ["aligned"]),
        (["asm", "{latin1}"], ["latin1.s:1", "UTF-8"]),
        (["run", "{huge}"], ["huge.s:1", "exceeds DRAM"]),
    ]:
        assert main([a.format(**files) for a in argv]) == 2
        err = capsys.readouterr().err
        assert all(w in err for w in words), (argv, err)


def test_all_zero_calibration_warns(files, tmp_path, capsys):
    np.save(tmp_path / "z.npy", np.zeros((4, 32), np.float32))
    argv = ["compile", files["mlp_onnx"], "--calib", str(tmp_path / "z.npy"), "-o", str(tmp_path / "m.npub")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "npu: warning:" in err and "all zeros" in err
