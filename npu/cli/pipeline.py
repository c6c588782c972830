"""`npu pipeline run graph.yaml`: run a multi-stage inference pipeline described in a YAML or JSON
file (docs/pipelines.md): sources, loader workers, model runners on one NPU, post-processors, joined
by basic, sync and copy queues. Prints per-stage throughput and latency, writes a Perfetto trace
(workers and the NPU) and a PNG of queue depths and stage occupancy."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import CliError, input_file, int_in

HELP = "run a multi-stage inference pipeline from a YAML/JSON graph"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = sub.add_parser("run", help="run a pipeline graph", description=__doc__)
    r.add_argument("graph", help="pipeline description (.yaml, .yml or .json)")
    r.add_argument(
        "--backend", choices=["model", "serial"], help="the NPU backend (default: the graph's, else model)"
    )
    r.add_argument("--port", help="serial backend: the board's port (e.g. /dev/ttyUSB1)")
    r.add_argument("--frames", type=int_in(0), help="frames per source (default: the graph's)")
    r.add_argument("-o", "--out", help="folder for trace.json and pipeline.png (default out/pipelines/NAME)")
    r.add_argument("--timeout", type=float, help="stop with an error after this many seconds")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    v = sub.add_parser("check", help="validate a pipeline graph without running it")
    v.add_argument("graph", help="pipeline description (.yaml, .yml or .json)")
    for q in (r, v):
        q.add_argument(
            "--trust",
            action="store_true",
            help="allow stage functions outside npu.* and the graph's folder (a graph file is code)",
        )


def run(args: argparse.Namespace) -> int:
    from npu.driver.pipeline import PipelineError, load_graph

    input_file(args.graph)
    if getattr(args, "backend", None) == "serial" and not args.port:
        raise CliError("--backend serial needs --port (e.g. --port /dev/ttyUSB1)")
    try:
        p = load_graph(
            args.graph,
            backend=getattr(args, "backend", None),
            frames=getattr(args, "frames", None),
            trust=args.trust,
        )
        if args.action == "check":
            print(f"{args.graph}: {len(p.stages)} stages, {len(p.queues)} queues: valid")
            return 0
        out = Path(args.out) if args.out else Path("out") / "pipelines" / p.name
        out.mkdir(parents=True, exist_ok=True)
        report = p.run(progress=False if args.no_progress or args.json else None, timeout_s=args.timeout)
    except PipelineError as e:
        raise CliError(str(e)) from None
    finally:
        if "p" in locals() and p.npu is not None:
            p.npu.close()
    report.save_chrome(out / "trace.json")
    report.save_png(out / "pipeline.png", title=f"pipeline {p.name}")
    if args.json:
        print(
            json.dumps(
                {**report.to_json(), "trace": str(out / "trace.json"), "png": str(out / "pipeline.png")}
            )
        )
    else:
        print(report.summary())
        print(
            f"trace: {out / 'trace.json'} (open in https://ui.perfetto.dev), picture: {out / 'pipeline.png'}"
        )
    return 0
