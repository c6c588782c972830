"""The `npu` command: assemble, disassemble, run, compile and benchmark NPU programs, generate the
RTL, build board bitstreams, and run the preemption demo. One module per command, each with
`add_arguments(parser)` and `run(args)`."""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from ..errors import NpuError
from . import asm, bench, build, compile, config, demo, disasm, dse, flash, hdl, pipeline, profile, regress
from . import run as run_cmd
from .common import CliError

COMMANDS = {
    "asm": asm,
    "disasm": disasm,
    "run": run_cmd,
    "bench": bench,
    "hdl": hdl,
    "config": config,
    "compile": compile,
    "demo": demo,
    "profile": profile,
    "pipeline": pipeline,
    "build": build,
    "flash": flash,
    "regress": regress,
    "dse": dse,
}

__all__ = ["CliError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npu", description=__doc__.split(".")[0] + ".")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name, mod in COMMANDS.items():
        sp = sub.add_parser(name, help=mod.HELP, description=mod.__doc__)
        mod.add_arguments(sp)
        sp.set_defaults(run=mod.run)
    return p


def _user_error(e: Exception) -> str | None:
    """The message of an error caused by the input (None for a bug)."""
    if isinstance(e, NpuError):
        return str(e)
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    if isinstance(e, UnicodeDecodeError):
        return f"the input is not UTF-8 text ({e})"
    return None


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"npu: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run one command; user errors print `npu: error: ...` and return 2 (1: a job failed)."""
    args = build_parser().parse_args(argv)
    warnings.showwarning = _show_warning
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("npu: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        msg = _user_error(e)
        if msg is None:
            if os.environ.get("NPU_DEBUG"):
                raise
            print(
                f"npu: internal error: {type(e).__name__}: {e} "
                "(a bug: please report it; NPU_DEBUG=1 shows the traceback)",
                file=sys.stderr,
            )
            return 3
        print(f"npu: error: {msg}", file=sys.stderr)
        job_error = sys.modules.get("npu.driver.runtime")
        return 1 if job_error is not None and isinstance(e, job_error.JobError) else 2


if __name__ == "__main__":
    sys.exit(main())
