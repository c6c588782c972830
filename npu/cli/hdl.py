"""`npu hdl verilog|replay`: the core's Verilog, and one random differential test on the RTL."""

from __future__ import annotations

import argparse

from ..config import PRESETS, get_config
from ..files import write_atomic
from ..registers import MAX_ENGINES
from .common import CliError, int_in

HELP = "RTL: generate Verilog, replay a random differential test"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="hdl_cmd", required=True, metavar="ACTION")
    v = sub.add_parser("verilog", help="write the Verilog of the SoC or of one core for a configuration")
    v.add_argument("--config", default="default", help=f"hardware preset: {', '.join(PRESETS)}")
    v.add_argument(
        "--engines",
        type=int_in(1, MAX_ENGINES),
        help="engines in the SoC (default: the preset's; implies --top soc)",
    )
    v.add_argument(
        "--top",
        choices=["auto", "soc", "core"],
        default="auto",
        help="npu_soc (engines behind one AXI4 port and a register decoder) or npu_core (one engine); "
        "auto: the SoC when the configuration has more than one engine (default)",
    )
    v.add_argument("-o", "--output", default="npu.v", help="output file (default npu.v)")
    v.set_defaults(func=verilog)
    r = sub.add_parser("replay", help="run one random program (by seed) on the RTL and the model")
    r.add_argument("--config", default="tiny", help=f"hardware preset: {', '.join(PRESETS)}")
    r.add_argument("--seed", type=int_in(0, 2**32 - 1), required=True, help="the random program's seed")
    r.add_argument("--pause", choices=["none", "every"], default="none", help="pause at every point")
    r.add_argument("--waves", action="store_true", help="record build/sim/<name>-waves/dump.vcd")
    r.set_defaults(func=replay)


def run(args: argparse.Namespace) -> int:
    return args.func(args)


def verilog(args: argparse.Namespace) -> int:
    from npu.hdl.verilog import core_verilog, soc_verilog

    cfg = get_config(args.config)
    if args.engines is not None:
        if args.top == "core":
            raise CliError("--engines builds a SoC; it cannot be combined with --top core")
        cfg = cfg.replace(
            name=f"{cfg.engine.name}-x{args.engines}" if args.engines > 1 else cfg.engine.name,
            engines=args.engines,
        )
    soc = args.top == "soc" or (args.top == "auto" and cfg.engines > 1) or args.engines is not None
    text = soc_verilog(cfg) if soc else core_verilog(cfg.engine)
    write_atomic(args.output, text)
    core = "MicroCore" if cfg.core == "micro" else "NpuCore"
    what = f"NpuSoc of {cfg.engines} engine(s)" if soc else core
    shown = cfg if soc else cfg.engine
    print(f"{args.output}: {what} for {shown.describe()} ({len(text.splitlines()):,} lines)")
    return 0


def replay(args: argparse.Namespace) -> int:
    from npu.sim.rtl.core import compare, run_model, run_rtl
    from npu.sim.rtl.suite import random_jobs

    cfg = get_config(args.config)
    cp_prob = 0.3 if args.pause == "every" else 0.15
    job = random_jobs(cfg, [args.seed], pause=args.pause, cp_prob=cp_prob)[0]
    rtl = run_rtl(cfg, [job], waves=args.waves)[0]
    model = run_model(cfg, job)
    diffs = compare(model, rtl)
    print(
        f"seed {args.seed} on {cfg.name}: model {model.status} in {model.counters['CYCLES']} cycles, "
        f"RTL {rtl.status} in {rtl.counters['CYCLES']} cycles"
    )
    for d in diffs:
        print(f"  differs: {d}")
    print("agree" if not diffs else "DISAGREE")
    return 0 if not diffs else 1
