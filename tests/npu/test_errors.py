"""Every user-facing error class derives from `npu.errors.NpuError`, which the `npu` command reports
as `npu: error: ...` (a bug is an internal error instead)."""

import ast
import builtins
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILTIN_ERRORS = {n for n in dir(builtins) if n.endswith(("Error", "Exception"))}


def test_every_error_class_has_the_npu_error_base():
    strays = []
    for folder in ("npu", "compiler", "driver", "hdl", "sim", "models"):
        for f in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if not isinstance(node, ast.ClassDef) or not node.name.endswith("Error"):
                    continue
                if node.name == "NpuError":
                    continue
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                if bases and bases <= BUILTIN_ERRORS:  # derives from built-in exceptions only
                    strays.append(f"{f.relative_to(ROOT)}: {node.name}({', '.join(sorted(bases))})")
    assert not strays, f"error classes without NpuError: {strays}"


def test_the_cli_reports_a_user_error_and_exits_2(tmp_path, capsys):
    from npu.cli import main

    bad = tmp_path / "bad.s"
    bad.write_text("frobnicate r1\n")
    assert main(["asm", str(bad), "-o", str(tmp_path / "b.bin")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("npu: error: ") and "bad.s:1" in err and "internal error" not in err
