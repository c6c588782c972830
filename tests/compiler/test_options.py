"""CompileOptions: one definition of every compile option, its choices, default and help; the CLI's
arguments are generated from it and a bad value names the option."""

import dataclasses

import pytest

from npu.cli import build_parser, main
from npu.compiler import CompileError, CompileOptions, compile_onnx
from npu.compiler.options import flag_of, from_arguments


def test_every_option_is_on_the_command_line_with_its_help(capsys):
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for f in dataclasses.fields(CompileOptions):
        assert flag_of(f) in text, f.name
        assert " ".join(f.metadata["help"].replace("%%", "%").split())[:40] in text, f.name


def test_the_command_line_defaults_are_the_options_defaults():
    args = build_parser().parse_args(["compile", "m.onnx"])
    assert from_arguments(args) == CompileOptions()


def test_command_line_values_reach_the_options():
    args = build_parser().parse_args(
        ["compile", "m.onnx", "--activations", "int8", "--cp-interval", "5000", "--no-cancel-points",
         "--input-shape", "x=1x3x8x8", "--spad-region", "0:64K", "--order-budget", "2.5"]
    )  # fmt: skip
    o = from_arguments(args)
    want = CompileOptions(
        activations="int8", cp_interval=5000, cancel_points=False, input_shapes={"x": (1, 3, 8, 8)},
        spad_region=(0, 65536), order_budget_s=2.5,
    )  # fmt: skip
    assert o == want


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"granularity": "layer"}, "granularity must be one of segment, operator, step, not 'layer'"),
        ({"cp_interval": -1}, "cp_interval must be a number >= 0, not -1"),
        ({"step_cycles": 0}, "step_cycles must be a number >= 1, not 0"),
        ({"order_budget_s": 0}, "order_budget_s must be a positive number, not 0"),
        ({"activations": "int4"}, "activations must be one of auto, int8, int16, mixed, not 'int4'"),
        (
            {"activation": "int8"},
            "unknown compile option 'activation'; options: acc_region, accuracy_check, activations",
        ),
    ],
)
def test_a_bad_option_is_a_compile_error_naming_it(change, message):
    with pytest.raises(CompileError, match=message):
        CompileOptions().replace(**change)


def test_the_cli_names_a_bad_value_by_its_flag(tmp_path, capsys):
    assert main(["compile", str(tmp_path / "m.onnx"), "--cp-interval", "-5"]) == 2
    assert "npu: error: --cp-interval must be a number >= 0, not -5" in capsys.readouterr().err
    assert main(["compile", "m.onnx", "--input-shape", "x=1x2", "--input-shape", "x=1x3"]) == 2
    assert "--input-shape x is given twice" in capsys.readouterr().err


def test_the_garbage_collector_thresholds_are_restored_after_a_compile(tmp_path):
    """compile_onnx raises the collector's thresholds while it runs (docs/compiler.md, compile
    time) and restores them after, when it fails too, and across compiles in several threads."""
    import gc
    import threading

    import onnx

    from npu.models import zoo

    z = zoo.ZOO["digits_mlp"]()
    onnx.save(z.model, str(tmp_path / "m.onnx"))
    before = gc.get_threshold()
    seen = []

    def one():
        cm = compile_onnx(
            tmp_path / "m.onnx", "tiny", calib=z.calib, progress=lambda _s: seen.append(gc.get_threshold())
        )
        assert cm.lowered.program

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen and all(s != before for s in seen) and gc.get_threshold() == before
    with pytest.raises(CompileError):
        compile_onnx(tmp_path / "missing.onnx", "tiny", calib=z.calib)
    assert gc.get_threshold() == before
