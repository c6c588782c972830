"""The `npu` command: assemble, disassemble, run and benchmark NPU programs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from .asm import AsmError, Assembly, disassemble, read_asm
from .config import PRESETS, ConfigError, get_config
from .isa import INSTR_BYTES, ErrorCode, IsaError, decode_program, validate


class CliError(Exception):
    pass


def _int(text: str) -> int:
    from .asm import parse_int

    try:
        return parse_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def cmd_compile(args) -> int:
    from npu.compiler import CompileError, compile_onnx

    calib = None
    if args.calib:
        try:
            calib = np.load(args.calib)
        except (OSError, ValueError) as e:
            raise CliError(f"--calib {args.calib}: cannot read: {e}") from None
    try:
        cm = compile_onnx(
            args.model,
            args.config,
            calib=calib,
            order=args.order,
            order_budget_s=args.order_budget,
            cp_interval=args.cp_interval,
            cp_max_live=args.cp_max_live,
        )
    except CompileError as e:
        raise CliError(str(e)) from None
    out = args.output or str(Path(args.model).with_suffix(".npub"))
    cm.to_container().save(out)
    low = cm.lowered
    n_npu = sum(la.placement == "npu" for la in low.layers)
    n_host = sum(la.placement == "host" for la in low.layers)
    print(
        f"{args.model} -> {out}: {len(low.program)} instructions, {n_npu} NPU operators, "
        f"{n_host} host operators, {len(low.cancel_points)} cancellation points, config {cm.cfg.name}"
    )
    if args.report:
        print(cm.report())
    return 0


def _run_npub(args) -> int:
    from npu.container import Container, ContainerError
    from npu.sim.runner import RunError, run_container

    try:
        c = Container.load(args.program)
    except ContainerError as e:
        raise CliError(str(e)) from None
    cfg = get_config(args.config or c.manifest.config)
    if not args.input:
        raise CliError(f"{args.program}: give the model's input with --input x.npy")
    xs = []
    for path in args.input:
        try:
            xs.append(np.load(path))
        except (OSError, ValueError) as e:
            raise CliError(f"--input {path}: cannot read: {e}") from None
    try:
        if args.backend == "rtl":
            from npu.driver.jobs import run_model
            from npu.driver.rtl import DEFAULT_DRAM, run_on_rtl

            dram = min(cfg.dram_bytes, DEFAULT_DRAM)
            outs, counters = run_on_rtl(run_model, c, xs, config=cfg, dram_bytes=dram)
        else:
            outs, counters = run_container(c, xs, cfg)
    except RunError as e:
        raise CliError(f"{args.program}: {e}") from None
    if args.output:  # for a compiled model: --output y.npy (several outputs: y.npy, y.1.npy, ...)
        if len(args.output) != 1 or "@" in args.output[0]:
            raise CliError("for an .npub model, give one --output FILE.npy")
        args.save = args.output[0]
    if args.save:
        base = Path(args.save)
        for i, y in enumerate(outs):
            np.save(base if i == 0 else base.with_suffix(f".{i}.npy"), y)
    print(
        f"{args.program} on {cfg.name}: {counters['CYCLES']:,} cycles "
        f"({counters['CYCLES'] / cfg.clock_mhz:,.1f} us at {cfg.clock_mhz:g} MHz)"
    )
    with np.printoptions(threshold=60, edgeitems=3, linewidth=100, precision=4):
        for t, y in zip(c.manifest.outputs, outs, strict=True):
            print(f"{t.name}: float32 {'x'.join(map(str, y.shape))}")
            print(y)
    if args.save:
        print(f"output saved to {args.save}")
    return 0


def _load_program(path: str) -> Assembly:
    """An Assembly from a `.s` file or a raw binary (no directives)."""
    p = Path(path)
    if not p.exists():
        raise CliError(f"{path}: no such file")
    if p.suffix in (".s", ".asm"):
        return read_asm(p)
    blob = p.read_bytes()
    try:
        instrs = decode_program(blob)
    except IsaError as e:
        raise CliError(f"{path}: {e}") from None
    return Assembly(instrs=instrs, lines=list(range(len(instrs))), source=str(p))


def _validate_all(asm: Assembly, cfg) -> None:
    for n, (ins, line) in enumerate(zip(asm.instrs, asm.lines, strict=False)):
        try:
            validate(ins, cfg)
        except IsaError as e:
            where = f"{asm.source}:{line}" if asm.source.endswith((".s", ".asm")) else f"{asm.source}: pc {n}"
            raise CliError(f"{where}: {e} [{ErrorCode(e.code).name} on {cfg.name}]") from None


def cmd_asm(args) -> int:
    asm = read_asm(args.source)
    cfg_name = args.config or asm.config
    if cfg_name:
        _validate_all(asm, get_config(cfg_name))
    out = Path(args.output or Path(args.source).with_suffix(".bin"))
    out.write_bytes(asm.binary())
    print(f"{args.source}: {len(asm.instrs)} instructions, {len(asm.instrs) * INSTR_BYTES} bytes -> {out}")
    return 0


def cmd_disasm(args) -> int:
    if args.program.endswith(".npub"):
        from npu.container import Container, ContainerError, HostStep, NpuSegment

        try:
            c = Container.load(args.program)
        except ContainerError as e:
            raise CliError(str(e)) from None
        instrs = decode_program(c.blobs["program"])
        notes: dict[int, list[str]] = {}
        man = c.manifest
        for i, seg in enumerate(man.segments):
            if isinstance(seg, NpuSegment):
                notes.setdefault(seg.pc, []).append(f"segment {i}: NPU program from pc {seg.pc}")
        for i, layer in enumerate(man.layers):
            if layer.pc is not None:
                notes.setdefault(layer.pc[0], []).append(
                    f"layer {i}: {layer.op} {layer.node or ''} {layer.shape}"
                )
        for cp in man.cancel_points:
            notes.setdefault(cp.pc, []).append(f"cancellation point {cp.id}, live bytes {cp.live_bytes}")
        for prev, seg in zip(man.segments, man.segments[1:], strict=False):
            if isinstance(seg, HostStep) and isinstance(prev, NpuSegment):
                notes.setdefault(prev.end, []).append(f"then host step: {', '.join(seg.nodes)}")
        notes = {pc: "; ".join(v) for pc, v in notes.items()}
        sys.stdout.write(disassemble(instrs, annotate=notes, show_pc=args.pc))
        return 0
    asm = _load_program(args.program)
    sys.stdout.write(disassemble(asm.instrs, show_pc=args.pc))
    return 0


def _fmt_counters(c: dict[str, int]) -> str:
    return "\n".join(f"  {k.lower():<15} {v:>12,}" for k, v in c.items())


def cmd_run(args) -> int:
    from npu.sim.runner import RunError, run_assembly

    if args.program.endswith(".npub"):
        return _run_npub(args)
    if args.backend != "model":
        raise CliError(f"--backend {args.backend} runs compiled .npub models; assembly runs on the model")
    asm = _load_program(args.program)
    cfg = get_config(args.config or asm.config or "default")
    for spec in args.dram or []:
        from .asm import DataInit

        path, _, addr = spec.rpartition("@")
        if not path:
            raise CliError(f"--dram {spec!r}: write FILE.npy@ADDR")
        asm.data.append(DataInit(_int(addr), "file", path=str(Path(path).resolve())))
    for spec in args.output or []:
        from .asm import Output, _parse_dtype, _parse_shape

        try:
            name, rest = spec.split("@", 1)
            addr, dtype, shape = rest.split(":")
            asm.outputs.append(Output(name, _int(addr), _parse_dtype(dtype), _parse_shape(shape)))
        except ValueError as e:
            raise CliError(f"--output {spec!r}: write NAME@ADDR:DTYPE:SHAPE ({e})") from None
    _validate_all(asm, cfg)
    try:
        res = run_assembly(asm, cfg, base=args.base, pause_at=args.pause_at, max_cycles=args.max_cycles)
    except RunError as e:
        raise CliError(str(e)) from None
    if args.save:
        np.savez(args.save, **res.outputs)
    if args.json:
        print(
            json.dumps(
                {
                    "program": args.program,
                    "config": cfg.name,
                    "status": res.status.name,
                    "error": ErrorCode(res.error_code).name,
                    "error_pc": res.error_pc,
                    "counters": res.counters,
                    "wall_s": round(res.wall_s, 6),
                    "pauses": [{"cp_id": a, "resume_pc": b} for a, b in res.pauses],
                    "outputs": {k: v.tolist() for k, v in res.outputs.items()},
                }
            )
        )
    else:
        print(f"{args.program} on {cfg.describe()}")
        print(
            f"status: {res.status.name}"
            + (f" ({ErrorCode(res.error_code).name} at pc {res.error_pc})" if res.error_code else "")
        )
        for cp, pc in res.pauses:
            print(f"paused at cancellation point {cp}, resumed at pc {pc}")
        with np.printoptions(threshold=200, edgeitems=4, linewidth=100):
            for name, arr in res.outputs.items():
                print(f"{name}: {arr.dtype} {'x'.join(map(str, arr.shape))}")
                print(arr)
        print("counters:")
        print(_fmt_counters(res.counters))
        us = res.counters["CYCLES"] / cfg.clock_mhz
        print(f"  = {us:,.1f} us at {cfg.clock_mhz:g} MHz; simulated in {res.wall_s:.3f} s")
        if args.save:
            print(f"outputs saved to {args.save}")
    return 0 if res.status.name == "DONE" else 1


def cmd_bench(args) -> int:
    cfg = get_config(args.config)
    if args.what == "gemm" and args.backend == "rtl":
        from npu.sim.bench import bench_rtl

        result = bench_rtl(
            cfg, args.sizes or [64, 128, 256], fast_dram=not args.axi_ram, pause_interval_tiles=args.cp_every
        )
        if args.json:
            print(json.dumps(result))
        else:
            for g in result["gemm"]:
                print(
                    f"GEMM {g['m']}^3: {g['cycles']:,} cycles (ideal {g['ideal_cycles']:,.0f}, "
                    f"utilization {g['utilization']:.3f}), model {g['model_cycles']:,} "
                    f"(error {g['model_error']:.3%}), bit-exact: {g['bit_exact']}"
                )
            print(
                f"simulation: {result['sim_cycles_per_s']:,.0f} cycles/s; pause latency max "
                f"{result['pause_latency_max']} cycles with points every N = {result['pause_interval_n']} "
                f"cycles and drain bound {result['drain_bound']}"
            )
        return 0
    if args.what == "preempt":
        from npu.driver.bench import bench_preempt, rtl_bench_preempt
        from npu.driver.demo import build_models, strategy_models

        models = build_models(cfg.name, args.cp_interval, cache=Path("build") / "demo")
        strategies = strategy_models(cfg.name, args.cp_interval, cache=Path("build") / "demo")
        if args.backend == "rtl":
            from npu.driver.rtl import run_on_rtl

            result = run_on_rtl(rtl_bench_preempt, cfg.name, models, strategies, args.frames, config=cfg)
        else:
            from npu.driver import ModelTransport

            result = bench_preempt(lambda: ModelTransport(cfg), cfg, models, strategies, args.frames)
        result["backend"] = args.backend
        result["cp_interval"] = args.cp_interval
        if args.json:
            print(json.dumps(result))
        else:
            sc = result["scenario"]
            print(
                f"scenario ({sc['frames']} frames): mean latency {sc['nonpreemptive_latency']:,.0f} cycles "
                f"without preemption, {sc['preemptive_latency']:,.0f} with (reduction {sc['reduction']:.1%})"
            )
            print(
                f"{len(result['points'])} points: max pause latency {result['max_pause_latency']:,} cycles "
                f"(interval {args.cp_interval:,}, drain bound {result['drain_bound']:,})"
            )
            for name, st in result["strategies"].items():
                print(
                    f"  {name:<17} urgent latency {st['urgent_latency']:>10,.0f} cycles, "
                    f"preempted slowdown {st['preempted_slowdown']:+.1%}"
                )
        return 0
    if args.what == "banks":
        from npu.compiler import CompileError
        from npu.compiler.bench import bench_banks

        try:
            result = bench_banks(cfg, args.models)
        except CompileError as e:
            raise CliError(str(e)) from None
        if args.json:
            print(json.dumps(result))
        else:
            for r in result["programs"]:
                maps = ", ".join(
                    f"{k} ({v['banks']} banks) x{v['slowdown']:.2f}" for k, v in r["mappings"].items()
                )
                print(f"{r['program']}: {r['steps']:,} matrix steps in {r['matmuls']} MATMULs; {maps}")
        return 0
    if args.what == "order":
        if args.backend != "model":
            raise CliError("bench order measures on the golden model; --backend rtl is not supported")
        from npu.compiler import CompileError
        from npu.compiler.bench import bench_order

        try:
            result = bench_order(cfg, args.models, args.timeout)
        except CompileError as e:
            raise CliError(str(e)) from None
        if args.json:
            print(json.dumps(result))
        else:
            for r in result["models"]:
                print(
                    f"{r['model']}: {r['default_cycles']:,} cycles in ONNX order, {r['searched_cycles']:,} "
                    f"searched ({r['gain']:.1%} fewer); search {r['search_s']} s over {r['subgraphs']} "
                    f"subgraphs, unpartitioned {r['search_s_unpartitioned']}"
                )
        return 0
    if args.what == "model" or (args.what == "gemm" and args.backend == "model"):
        from npu.sim.bench import bench_model

        result = bench_model(cfg, args.size)
    else:
        raise CliError(f"bench {args.what!r} is not built yet")
    if args.json:
        print(json.dumps(result))
    else:
        g = result["gemm"]
        print(
            f"GEMM {g['m']}x{g['n']}x{g['k']} on {cfg.name}: {g['cycles']:,} cycles "
            f"(ideal {g['ideal_cycles']:,.0f}, utilization {g['utilization']:.3f}), "
            f"simulated in {g['wall_s']:.3f} s = {result['sim_cycles_per_s']:,.0f} cycles/s, "
            f"bit-exact: {g['bit_exact']}"
        )
    return 0


def cmd_hdl_verilog(args) -> int:
    from npu.hdl.verilog import core_verilog

    cfg = get_config(args.config)
    text = core_verilog(cfg)
    Path(args.output).write_text(text)
    print(f"{args.output}: NpuCore for {cfg.describe()} ({len(text.splitlines()):,} lines)")
    return 0


def cmd_hdl_replay(args) -> int:
    from npu.sim.rtl import compare, run_model, run_rtl
    from npu.sim.rtl_suite import random_jobs

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


def cmd_config(args) -> int:
    names = [args.name] if args.name else list(PRESETS)
    for n in names:
        cfg = get_config(n)
        if args.json:
            print(json.dumps({"name": cfg.name, "config_id": cfg.config_id, **cfg.hardware_dict()}))
        else:
            print(cfg.describe())
    return 0


def cmd_demo(args) -> int:
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
        from npu.driver.rtl import run_on_rtl

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
        (out / "demo.json").write_text(json.dumps({"nonpreemptive": non, "preemptive": pre}))
    return 0 if pre["perception_outputs_identical"] else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npu", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    a = sub.add_parser("asm", help="assemble a .s file to a binary program")
    a.add_argument("source")
    a.add_argument("-o", "--output", help="output file (default: SOURCE with .bin)")
    a.add_argument("--config", help="also check every rule of this configuration (default: .config)")
    a.set_defaults(func=cmd_asm)

    d = sub.add_parser("disasm", help="print a binary (or .s) program as canonical assembly")
    d.add_argument("program")
    d.add_argument("--pc", action="store_true", help="annotate each line with its pc")
    d.set_defaults(func=cmd_disasm)

    r = sub.add_parser("run", help="run a program on the golden model, print outputs and counters")
    r.add_argument("program", help=".s file (with .data/.output directives) or binary")
    r.add_argument("--config", help=f"one of {', '.join(PRESETS)} (default: the file's .config)")
    r.add_argument(
        "--backend",
        default="model",
        choices=["model", "rtl"],
        help="execution backend (rtl: an .npub model on the simulated core through the driver)",
    )
    r.add_argument("--base", type=_int, default=0, help="DRAM address of the program (default 0)")
    r.add_argument("--dram", action="append", metavar="FILE.npy@ADDR", help="preload DRAM")
    r.add_argument(
        "--output",
        action="append",
        metavar="NAME@ADDR:DTYPE:SHAPE",
        help="read a result back, e.g. C@0x40000:i8:64x64 (for an .npub model: the output file, y.npy)",
    )
    r.add_argument(
        "--pause-at",
        type=_int,
        action="append",
        metavar="CYCLE",
        help="request a pause at this cycle, then resume (repeatable)",
    )
    r.add_argument("--max-cycles", type=_int, help="give up after this many cycles")
    r.add_argument("--save", metavar="OUT.npz", help="save outputs (.npy for an .npub's output)")
    r.add_argument("--input", action="append", metavar="X.npy", help="an .npub model's float input")
    r.add_argument("--json", action="store_true", help="machine-readable output")
    r.set_defaults(func=cmd_run)

    b = sub.add_parser("bench", help="benchmarks that print figures (use --json)")
    b.add_argument(
        "what",
        choices=["model", "gemm", "order", "preempt", "banks"],
        help="model: GEMM on the golden model; gemm: GEMM sweep on --backend; "
        "order: operator order search on the zoo's branchy models; preempt: the preemption "
        "scenario and strategies; banks: matrix slowdown of candidate scratchpad bank mappings",
    )
    b.add_argument("--models", nargs="+", help="order, banks: zoo models (default: a representative set)")
    b.add_argument(
        "--timeout", type=float, default=60.0, help="order: time limit of the unpartitioned search (s)"
    )
    b.add_argument("--backend", choices=["model", "rtl"], default="model")
    b.add_argument("--config", default="default")
    b.add_argument("--size", type=int, default=256, help="model GEMM m = n = k (default 256)")
    b.add_argument("--sizes", type=int, nargs="+", help="RTL GEMM sizes (default 64 128 256)")
    b.add_argument(
        "--cp-every",
        type=int,
        default=1,
        help="RTL pause-latency program: a cancellation point every this many output tiles",
    )
    b.add_argument(
        "--axi-ram",
        action="store_true",
        help="RTL: serve DRAM with cocotbext-axi's AxiRam (slower) instead of the in-simulator RAM",
    )
    b.add_argument("--frames", type=int, default=4, help="preempt: frames of the scenario")
    b.add_argument("--cp-interval", type=int, default=20_000, help="preempt: the compiler's point interval")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bench)

    h = sub.add_parser("hdl", help="RTL: generate Verilog, replay a random differential test")
    hsub = h.add_subparsers(dest="hdl_cmd", required=True, metavar="ACTION")
    hv = hsub.add_parser("verilog", help="write the NpuCore Verilog for a configuration")
    hv.add_argument("--config", default="default")
    hv.add_argument("-o", "--output", default="npu.v")
    hv.set_defaults(func=cmd_hdl_verilog)
    hr = hsub.add_parser("replay", help="run one random program (by seed) on the RTL and the model")
    hr.add_argument("--config", default="tiny")
    hr.add_argument("--seed", type=int, required=True)
    hr.add_argument("--pause", choices=["none", "every"], default="none")
    hr.add_argument("--waves", action="store_true", help="record build/sim/<name>-waves/dump.vcd")
    hr.set_defaults(func=cmd_hdl_replay)

    c = sub.add_parser("config", help="show hardware configuration presets")
    c.add_argument("name", nargs="?")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_config)

    cp = sub.add_parser("compile", help="compile an ONNX model to an .npub container")
    cp.add_argument("model")
    cp.add_argument("-o", "--output", help="output .npub (default: MODEL with .npub)")
    cp.add_argument("--config", default="default")
    cp.add_argument("--calib", metavar="CALIB.npy", help="calibration inputs for a float model")
    cp.add_argument(
        "--report",
        action="store_true",
        help="print placement, splits, subgraphs and chosen orders, cancellation points, cycles, "
        "scratchpad peak",
    )
    cp.add_argument(
        "--order",
        choices=["search", "default"],
        default="search",
        help="operator order: search (key-node partitioned, golden-model timing) or default (ONNX order)",
    )
    cp.add_argument(
        "--order-budget", type=float, default=10.0, metavar="S", help="time limit of the order search (s)"
    )
    cp.add_argument(
        "--cp-interval",
        type=_int,
        default=0,
        metavar="N",
        help="also place cancellation points inside operators, at most N estimated cycles apart where "
        "possible (default 0: only at operator boundaries)",
    )
    cp.add_argument(
        "--cp-max-live",
        type=_int,
        metavar="BYTES",
        help="skip interior points whose live on-chip data exceed BYTES (default: a quarter of the "
        "scratchpad)",
    )
    cp.set_defaults(func=cmd_compile)

    x = sub.add_parser("demo", help="the perception/planning preemption scenario, with a table and timelines")
    x.add_argument("--backend", choices=["rtl", "model"], default="rtl", help="default rtl (Verilator)")
    x.add_argument("--config", default="default")
    x.add_argument("--frames", type=int, default=4)
    x.add_argument("--cp-interval", type=int, default=20_000, help="compiler's point interval (cycles)")
    x.add_argument("--period-ms", type=float, help="frame period (default 1.05 x the perception time)")
    x.add_argument(
        "--post-ms", type=float, help="host post-processing time per frame (default 0.25 x perception)"
    )
    x.add_argument("--out", default="out/demo", help="folder for the traces and pictures")
    x.add_argument("--json", action="store_true", help="also write demo.json with every figure")
    x.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CliError, AsmError, ConfigError) as e:
        print(f"npu: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
