"""`npu demo`: the perception/planning preemption scenario, with a table and timelines."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..config import PRESETS, get_config
from ..files import write_atomic
from .common import int_in, positive_float

HELP = "the perception/planning preemption scenario, with a table and timelines"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=["rtl", "model"], default="rtl", help="default rtl (Verilator)")
    p.add_argument("--config", default="default", help=f"hardware preset: {', '.join(PRESETS)}")
    p.add_argument("--frames", type=int_in(1, 1000), default=4, help="frames of the scenario (default 4)")
    p.add_argument("--cp-interval", type=int_in(1), default=20_000, help="compiler's point interval (cycles)")
    p.add_argument(
        "--period-ms", type=positive_float, help="frame period (default 1.05 x the perception time)"
    )
    p.add_argument(
        "--post-ms",
        type=positive_float,
        help="host post-processing time per frame (default 0.25 x perception)",
    )
    p.add_argument("--out", default="out/demo", help="folder for the traces and pictures")
    p.add_argument("--json", action="store_true", help="also write demo.json with every figure")


def run(args: argparse.Namespace) -> int:
    from npu.driver.demo import both_modes, build_models, format_table, rtl_both_modes

    cfg = get_config(args.config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"compiling the zoo's perception CNN (points every {args.cp_interval} cycles) and planning MLP ...")
    models = build_models(cfg.name, args.cp_interval, cache=Path("build") / "demo")
    print(
        f"running {args.frames} frames without and with preemption on the {args.backend} backend ...",
        flush=True,
    )
    t0 = time.perf_counter()
    cyc = cfg.clock_mhz * 1000  # cycles per millisecond
    timing = {}
    if args.period_ms:
        timing["period"] = int(args.period_ms * cyc)
    if args.post_ms is not None:
        timing["post_cycles"] = int(args.post_ms * cyc)
    if args.backend == "rtl":
        from npu.sim.rtl.transport import run_on_rtl

        non, pre, tr_non, tr_pre = run_on_rtl(
            rtl_both_modes, cfg.name, models, args.frames, timing, config=cfg
        )
    else:
        from npu.driver import ModelTransport

        non, pre, tr_non, tr_pre = both_modes(
            lambda: ModelTransport(cfg), cfg.name, models, args.frames, timing
        )
    print(f"({time.perf_counter() - t0:.1f} s)\n")
    print(format_table(non, pre, cfg.clock_mhz))
    for name, tr, title in (
        ("nonpreemptive", tr_non, "without preemption"),
        ("preemptive", tr_pre, "with preemption at cancellation points"),
    ):
        tr.save_chrome(out / f"trace-{name}.json")
        tr.save_png(
            out / f"timeline-{name}.png", f"perception/planning on the {args.backend} backend, {title}"
        )
    print(
        f"\ntraces (open in https://ui.perfetto.dev): {out}/trace-preemptive.json, "
        f"{out}/trace-nonpreemptive.json"
        f"\ntimelines: {out}/timeline-preemptive.png, {out}/timeline-nonpreemptive.png"
    )
    if args.json:
        write_atomic(out / "demo.json", json.dumps({"nonpreemptive": non, "preemptive": pre}))
    return 0 if pre["perception_outputs_identical"] else 1
