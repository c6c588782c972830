"""`npu bench board`: what one inference of each tinyML model costs on a board.

Each model is compiled for the board's preset with the compiler's default options, run on
the golden model (the reference outputs and the model's cycle count), then run once on the board's
simulated top - the bitstream's own RTL with the SDRAM or SPRAM model, driven over the UART by the
host's driver (sim/rtl/cocotb_board_bench.py). The figures: the board's cycles per inference (the
core's CYCLES counter of the job), the golden model's beside it and its error, the latency at the
Fmax the last `npu build` of the board routed, the MAC utilisation, and whether every output is
bit-exact against the golden model. The board's peak, resources and Fmax come from that build's
report (build/boards/<board>/build_report.json). Before the models, the probe programs of
sim/rtl/probes.py (one instruction of a chosen shape each) are timed the same way: the calibration
of the golden model's narrow-DRAM and micro-core timing (docs/isa.md, Timing).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from npu.config import NpuConfig

from .probes import dma_probes, encode, op_probes

#: the tinyML set (npu.models.zoo.TINYML) in the order the bench runs it
DEFAULT_MODELS = ("ds_cnn_kws", "resnet8", "mobilenet_v1_025_vww", "fc_autoencoder")


def _last_build(board: str, build_root: Path, cfg: NpuConfig) -> tuple[dict | None, Path]:
    """(the last build's report, its path) for `cfg` on `board`: `build_root/<config>/` (where
    docs/boards.md builds a `--config` preset with `-o`) when its report is of `cfg`, else the
    board's own `build_root/<board>/` (None when neither has a report)."""
    want = f"{cfg.config_id:#010x}"
    paths = [build_root / d / "build_report.json" for d in dict.fromkeys((cfg.name, board))]
    reports = [(json.loads(p.read_text()), p) for p in paths if p.exists()]
    for r, p in reports:
        if r.get("config_id") == want:
            return r, p
    return reports[-1] if reports and reports[-1][1].parent.name == board else (None, paths[-1])


def _busy(counters: dict) -> dict[str, int]:
    """Each unit's busy cycles (the BUSY_* performance counters) by unit name."""
    return {k[5:].lower(): int(v) for k, v in counters.items() if k.startswith("BUSY_")}


def _compile(name: str, cfg: NpuConfig, tmp: Path):
    """(CompiledModel, its container file, one test input) of zoo model `name` for `cfg`."""
    import onnx

    from npu.compiler import compile_onnx
    from npu.compiler.bench import zoo_builders

    z = zoo_builders([name])[name]()
    onnx.save(z.model, str(tmp / f"{name}.onnx"))
    cm = compile_onnx(tmp / f"{name}.onnx", cfg, calib=z.calib)  # the defaults a user gets
    batch = z.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value or 1
    path = tmp / f"{name}.npub"
    cm.to_container().save(path)
    return cm, path, z.test[:batch]


def bench_board(
    board_name: str,
    names: list[str] | None = None,
    *,
    probes: bool = True,
    build_root: Path = Path("build/boards"),
    config: str | None = None,
    say: Callable[[str], None] = lambda s: print(f"bench board: {s}", file=sys.stderr, flush=True),
) -> dict:
    from npu.compiler.errors import CompileError
    from npu.compiler.roofline import roofline, traffic
    from npu.driver.runtime import Npu
    from npu.hdl.boards.boards import BOARDS
    from npu.hdl.boards.build import board_macs_per_cycle
    from npu.hdl.boards.top import SIM_DIVISOR
    from npu.hdl.verilog import board_sim_verilog

    from .hdlsim import build_and_test

    if board_name not in BOARDS:
        raise CompileError(f"unknown board {board_name!r}; choose from {', '.join(BOARDS)}")
    board = BOARDS[board_name]
    cfg = board.config(config)  # checked against the board before any model is compiled
    build, report = _last_build(board.name, build_root, cfg)
    # the slowest clock's routed Fmax (the core's: the boards have one clock domain)
    fmax = min(v["achieved_mhz"] for v in build["fmax"].values()) if build and build.get("fmax") else None
    if build and build.get("config_id") != f"{cfg.config_id:#010x}":
        say(
            f"the last build ({report.parent}) is of configuration {build.get('config_id')}, not "
            f"{cfg.config_id:#010x}: its Fmax and resources are quoted, rebuild for this one's "
            f"(npu build --board {board.name} --config {cfg.name} -o {build_root / cfg.name})"
        )
    macs = board_macs_per_cycle(cfg)
    rows, runs = [], []
    with tempfile.TemporaryDirectory(prefix="bench-board-") as tmpdir:
        tmp = Path(tmpdir)
        golden = Npu("model", cfg)
        for name in DEFAULT_MODELS if names is None else names:
            say(f"{name}: compiling for {cfg.name}")
            try:
                cm, path, x = _compile(name, cfg, tmp)
            except CompileError as e:  # e.g. does not fit the board's memories
                rows.append({"name": name, "error": str(e)})
                continue
            job = golden.load(path, name).submit(x, int8=True)
            ref = job.result()
            bound = roofline(cfg, cm.placement.macs_npu, traffic(cm, job.counters), macs)
            rows.append(
                {
                    "name": name,
                    "macs": cm.placement.macs_npu,
                    "model_cycles": int(job.counters["CYCLES"]),
                    "_busy": _busy(job.counters),
                    "quantisation": cm.quantisation,
                    # the most of the MACs the board's DRAM lets any program use (npu bench roofline)
                    "utilization_bound": bound["utilization_bound"],
                    "_ref": ref,
                }
            )
            runs.append((rows[-1], path, x))
        probe = encode({**dma_probes(cfg), **op_probes(cfg)}) if probes else {}
        probe_rows = []
        for k, (label, prog) in enumerate(probe.items()):
            (tmp / f"probe{k}.bin").write_bytes(prog)
            golden.run_raw(prog)
            probe_rows.append({"probe": label, "model_cycles": int(golden.counters()["CYCLES"])})
        if runs or probe:
            say(f"board simulation of {len(runs)} model(s) and {len(probe)} probe programs on {board.name}")
            inputs = tmp / "inputs.npz"
            np.savez(inputs, **{f"x{k}": x for k, (_, _, x) in enumerate(runs)})
            result = tmp / "result.json"
            env = {
                "BOARD_CONFIG": cfg.name,
                "BOARD_MODELS": os.pathsep.join(str(p) for _, p, _ in runs),
                "BOARD_PROGRAMS": os.pathsep.join(str(tmp / f"probe{k}.bin") for k in range(len(probe))),
                "BOARD_INPUTS": str(inputs),
                "BOARD_RESULT": str(result),
                "BOARD_DRAM": board.dram,
                "BOARD_CLOCK_MHZ": str(board.clock_mhz),
                "BOARD_DIVISOR": str(SIM_DIVISOR),
            }
            build_and_test(
                board_sim_verilog(board, cfg),
                "board_top",
                "npu.sim.rtl.cocotb_board_bench",
                name=f"board-{board.name}",
                extra_env=env,
                quiet=True,
            )
            measured = json.loads(result.read_text())
            outs = np.load(str(result) + ".npz")
            for k, ((row, _, _), got) in enumerate(zip(runs, measured["rows"], strict=True)):
                ref = row.pop("_ref")
                cycles = got["cycles"]
                row["cycles"] = cycles
                row["model_error"] = round((row["model_cycles"] - cycles) / cycles, 4)
                row["latency_ms"] = round(cycles / fmax / 1000, 4) if fmax else None
                row["utilization"] = round(row["macs"] / (cycles * macs), 4)
                row["bit_exact"] = all(np.array_equal(outs[f"y{k}_{i}"], r) for i, r in enumerate(ref))
                # each unit's busy cycles on the board beside the golden model's: where an estimate misses
                model_busy, board_busy = row.pop("_busy"), _busy(got["counters"])
                row["units"] = {u: {"cycles": board_busy[u], "model_cycles": c} for u, c in model_busy.items()
                                if u in board_busy}  # fmt: skip
            for row, got in zip(probe_rows, measured["probes"], strict=True):
                row["cycles"] = got["cycles"]
                row["model_error"] = round((row["model_cycles"] - got["cycles"]) / got["cycles"], 4)
                if got["status"] != "DONE":
                    row["status"] = got["status"]
            say(f"simulated {measured['simulated_cycles']:,} cycles in {measured['seconds']:.0f} s")
    return {
        "board": board.name,
        "config": cfg.name,
        "macs_per_cycle": round(macs, 4),
        "clock_mhz": board.clock_mhz,
        "achieved_mhz": fmax,
        "timing_met": build["timing_met"] if build else None,
        "peak_gops": round(2 * macs * fmax / 1000, 6) if fmax else None,
        "resources": build["resources"] if build else None,
        "build_report": str(report) if build else None,
        "build_config_id": build.get("config_id") if build else None,
        "models": rows,
        "probes": probe_rows,
    }


def format_board(r: dict) -> str:
    head = f"{r['board']} ({r['config']}): {r['macs_per_cycle']} MACs/cycle, " + (
        f"{r['achieved_mhz']} MHz routed (timing {'met' if r['timing_met'] else 'not met'}), "
        f"peak {r['peak_gops']} GOPS"
        if r["achieved_mhz"]
        else f"no build report (npu build --board {r['board']}): latencies not known"
    )
    lines = [head]
    for m in r["models"]:
        if "error" in m:
            lines.append(f"  {m['name']}: {m['error']}")
            continue
        lat = f"{m['latency_ms']} ms, " if m["latency_ms"] is not None else ""
        lines.append(
            f"  {m['name']}: {m['cycles']:,} cycles ({lat}golden model {m['model_cycles']:,}, "
            f"error {m['model_error']:+.1%}), utilisation {m['utilization']}, "
            f"{'bit-exact' if m['bit_exact'] else 'OUTPUTS DIFFER'}"
        )
    for p in r.get("probes", []):
        lines.append(
            f"  probe {p['probe']}: {p['cycles']:,} cycles, golden model {p['model_cycles']:,} "
            f"({p['model_error']:+.1%})"
        )
    return "\n".join(lines)


def save_plot(results: list[dict], path: str | Path) -> None:
    """A bar chart of the latency per inference of each model on each board of `results` (bench
    board JSONs): at the last build's Fmax, or at the board's nominal clock when it has no build."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from npu.files import replacing

    names = list(dict.fromkeys(m["name"] for r in results for m in r["models"] if "cycles" in m))
    fig, ax = plt.subplots(figsize=(2 + 1.6 * max(1, len(names)), 4))
    width = 0.8 / max(1, len(results))
    for k, r in enumerate(results):
        mhz = r["achieved_mhz"] or r["clock_mhz"]
        lat = {m["name"]: m["cycles"] / mhz / 1000 for m in r["models"] if "cycles" in m}
        xs = [i + k * width for i, n in enumerate(names) if n in lat]
        label = f"{r['board']} ({r['macs_per_cycle']:g} MACs/cycle, {mhz:g} MHz"
        label += ")" if r["achieved_mhz"] else " nominal)"
        ax.bar(xs, [lat[n] for n in names if n in lat], width, label=label)
    ax.set_xticks([i + width * (len(results) - 1) / 2 for i in range(len(names))], names, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("latency per inference (ms)")
    ax.set_title("npu bench board: board simulation, one inference each")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
