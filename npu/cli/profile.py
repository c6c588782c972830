"""`npu profile`: run a compiled model alone on a quiet device and write each NPU segment's measured
cycles into the container as its reference runtime (what the operator queues of `Npu(dispatch=...)`
use; the operator-queue design's first run in a preset environment)."""

from __future__ import annotations

import argparse
import json

from .common import CliError, input_file, output_file

HELP = "measure per-operator (per-segment) cycles and store them in the .npub"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="compiled model (.npub); best compiled with --granularity operator")
    p.add_argument("-o", "--output", help="where to write the profiled container (default: in place)")
    p.add_argument(
        "--backend", default="model", choices=["model", "rtl"], help="device to measure on (default model)"
    )
    p.add_argument("--json", action="store_true", help="print the measured cycles as JSON")


def run(args: argparse.Namespace) -> int:
    from npu.container import Container, ContainerError, NpuSegment
    from npu.driver.profile import measure, with_reference_runtimes
    from npu.driver.transport import ModelTransport

    input_file(args.model)
    out = output_file(args.output or args.model)
    try:
        c = Container.load(args.model)
    except ContainerError as e:
        raise CliError(str(e)) from None
    from npu.config import get_config

    cfg = get_config(c.manifest.config)
    if args.backend == "rtl":
        from npu.sim.rtl.transport import DEFAULT_DRAM, run_on_rtl

        cycles = run_on_rtl(measure, c, config=cfg, dram_bytes=min(cfg.dram_bytes, DEFAULT_DRAM))
    else:
        cycles = measure(ModelTransport(cfg), c)
    profiled = with_reference_runtimes(c, cycles)
    profiled.save(out)
    segs = profiled.manifest.segments
    rows = [
        {"segment": i, "est_cycles": s.est_cycles, "ref_cycles": s.ref_cycles}
        for i, s in enumerate(segs)
        if isinstance(s, NpuSegment)
    ]
    if args.json:
        print(json.dumps({"model": str(args.model), "backend": args.backend, "output": str(out),
                          "segments": rows}))  # fmt: skip
    else:
        print(f"{args.model}: {len(rows)} NPU segments measured on the {args.backend} backend -> {out}")
        print(f"  {'segment':>7} {'estimated':>10} {'measured':>10}")
        for r in rows:
            print(f"  {r['segment']:>7} {r['est_cycles'] or 0:>10} {r['ref_cycles']:>10}")
        print(f"  total measured: {sum(r['ref_cycles'] for r in rows)} cycles")
    return 0
