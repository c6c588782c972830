"""The `npu` command: assemble, disassemble, run, compile and benchmark NPU programs, generate the
RTL, and run the preemption demo. One module per command, each with `add_arguments(parser)` and
`run(args)`."""

from __future__ import annotations

import argparse
import sys

from ..asm import AsmError
from ..config import ConfigError
from . import asm, bench, compile, config, demo, disasm, hdl
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (CliError, AsmError, ConfigError) as e:
        print(f"npu: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
