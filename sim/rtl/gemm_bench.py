"""Benchmarks of the golden model (`npu bench model`)."""

from __future__ import annotations

import time

import numpy as np

from npu.arith import round_up
from npu.compiler.programs import choose_tiling, gemm_program, gemm_reference, gemm_requant
from npu.config import NpuConfig
from npu.isa import encode_program
from npu.sim.golden.model import NpuModel
from npu.timing import ideal_matmul_cycles


def bench_gemm(cfg: NpuConfig, m: int, n: int, k: int, *, seed: int = 0) -> dict:
    """Run one tiled GEMM on the model; figures plus a bit-exactness check against numpy."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    bt = rng.integers(-128, 128, (n, k), dtype=np.int8)
    mult, shift = gemm_requant(k)
    a_addr = 0x10000
    b_addr = a_addr + round_up(m * k, 4096)
    c_addr = b_addr + round_up(n * k, 4096)
    p_addr = c_addr + round_up(m * n, 4096)
    t_build = time.perf_counter()
    prog = gemm_program(cfg, m, n, k, a_addr, b_addr, c_addr, mult=mult, shift=shift, relu=True)
    blob = encode_program(prog.instrs)
    build_s = time.perf_counter() - t_build
    model = NpuModel(cfg)
    model.write_dram(a_addr, a)
    model.write_dram(b_addr, bt)
    model.load_program(blob, p_addr)
    t0 = time.perf_counter()
    model.start()
    status = model.run()
    wall = time.perf_counter() - t0
    out = np.frombuffer(model.read_dram(c_addr, m * n), np.int8).reshape(m, n)
    ref = gemm_reference(a, bt, mult=mult, shift=shift, relu=True)
    cycles = model.counter_values()["CYCLES"]
    ideal = ideal_matmul_cycles(m, n, k, cfg)
    t = choose_tiling(cfg, m, n, k)
    return {
        "m": m,
        "n": n,
        "k": k,
        "config": cfg.name,
        "status": status.name,
        "instructions": len(prog.instrs),
        "tiling": {"tm": t.tm, "tn": t.tn, "tk": t.tk},
        "wall_s": round(wall, 6),
        "build_s": round(build_s, 6),
        "cycles": cycles,
        "ideal_cycles": ideal,
        "utilization": round(ideal / cycles, 6) if cycles else 0.0,
        "bit_exact": bool(np.array_equal(out, ref)),
        "counters": model.counter_values(),
    }


def bench_model(cfg: NpuConfig, size: int = 256) -> dict:
    g = bench_gemm(cfg, size, size, size)
    return {
        "backend": "model",
        "config": cfg.name,
        "config_id": f"0x{cfg.config_id:08x}",
        "macs_per_cycle": cfg.macs_per_cycle,
        "gemm": g,
        "sim_cycles_per_s": round(g["cycles"] / g["wall_s"], 1) if g["wall_s"] else None,
    }


def gemm_job(cfg: NpuConfig, size: int, seed: int = 0, cancel_every: int = 0):
    """A random GEMM as an RTL job: the job, the expected C, its DRAM address and the built program."""
    from npu.sim.rtl.core import RtlJob

    m = n = k = size
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    bt = rng.integers(-128, 128, (n, k), dtype=np.int8)
    mult, shift = gemm_requant(k)
    a_addr = 0x1000
    b_addr = a_addr + m * k
    c_addr = b_addr + n * k
    p_addr = round_up((c_addr + m * n), 4096)
    prog = gemm_program(
        cfg, m, n, k, a_addr, b_addr, c_addr, mult=mult, shift=shift, relu=True, cancel_every=cancel_every
    )
    blob = encode_program(prog.instrs)
    job = RtlJob(
        f"gemm{size}", blob, p_addr, {a_addr: a.tobytes(), b_addr: bt.tobytes()}, window=p_addr + len(blob)
    )
    ref = gemm_reference(a, bt, mult=mult, shift=shift, relu=True)
    return job, ref, c_addr, prog


def bench_gemm_rtl(cfg: NpuConfig, sizes=(64, 128, 256), fast_dram: bool = True) -> dict:
    """GEMMs on the RTL (cocotb + Verilator): hardware cycle counter vs ideal and vs the model."""
    from npu.sim.rtl.core import run_model, run_rtl

    jobs = [gemm_job(cfg, s) for s in sizes]
    t0 = time.perf_counter()
    records = run_rtl(cfg, [j for j, *_ in jobs], fast_dram=fast_dram)
    wall = time.perf_counter() - t0
    sim_wall = sum(r.wall_s for r in records)
    run_wall = sum(r.run_wall_s for r in records)
    out = []
    total_cycles = 0
    for (job, ref, c_addr, _), rec, size in zip(jobs, records, sizes, strict=True):
        model = run_model(cfg, job)
        got = np.frombuffer(rec.dram[c_addr : c_addr + size * size], np.int8).reshape(size, size)
        cycles = rec.counters["CYCLES"]
        total_cycles += cycles
        ideal = ideal_matmul_cycles(size, size, size, cfg)
        mc = model.counters["CYCLES"]
        out.append(
            {
                "m": size,
                "n": size,
                "k": size,
                "status": rec.status,
                "bit_exact": bool(np.array_equal(got, ref)),
                "cycles": cycles,
                "ideal_cycles": ideal,
                "utilization": round(ideal / cycles, 6) if cycles else 0.0,
                "model_cycles": mc,
                "model_error": round(abs(mc - cycles) / cycles, 6) if cycles else None,
                "busy": {u: rec.counters[f"BUSY_{u.upper()}"] for u in ("load", "matrix", "vector", "store")},
            }
        )
    return {
        "backend": "rtl",
        "config": cfg.name,
        "dram": "in-simulator RAM" if fast_dram else "cocotbext-axi AxiRam",
        "gemm": out,
        "wall_s": round(wall, 3),  # including Verilog generation and simulator start
        "sim_wall_s": round(sim_wall, 3),  # the jobs in the running simulator, DRAM set-up included
        "run_wall_s": round(run_wall, 3),  # START to stop only
        "sim_cycles_per_s": round(total_cycles / run_wall, 1) if run_wall else None,
        "sim_cycles_per_s_with_dram_io": round(total_cycles / sim_wall, 1) if sim_wall else None,
    }


def pause_figures(cfg: NpuConfig, job) -> tuple[int, int, int, list[int]]:
    """From one uninterrupted, traced model run: N, the largest gap between the times the last unit
    passes consecutive cancellation points (start and end included); the drain bound D, the largest
    time between the first and the last unit passing the same point; the tight bound
    max_k (last unit passes k) - (first start after k - 1) <= N + D; and the points' times
    (docs/isa.md, "Pause latency bound")."""
    from npu.sim.golden.runner import first_starts_after, point_passes
    from npu.sim.rtl.core import prepared_model

    m = prepared_model(cfg, job, trace=True)
    m.start()
    m.run()
    assert m.trace is not None
    passes = point_passes(m.trace)
    first = [f for _, (f, _) in sorted(passes.items())]
    last = [la for _, (_, la) in sorted(passes.items())]
    end = m.counter_values()["CYCLES"]
    times = [0, *last, end]
    n_gap = max(b - a for a, b in zip(times, times[1:], strict=False))
    drain = max((b - a for a, b in zip(first, last, strict=True)), default=0)
    # a pause asked before anything after point k - 1 starts stops there: from then on, at point k
    pcs = sorted(passes)
    starts = first_starts_after(m.trace, pcs)
    after = [starts.get(pc, end) for pc in pcs]
    tight = max(b - a for a, b in zip([0, *after], [*last, end], strict=True))
    return n_gap, drain, tight, last


def bench_rtl(
    cfg: NpuConfig,
    sizes=(64, 128, 256),
    *,
    fast_dram: bool = True,
    pause_interval_tiles: int = 1,
    pause_samples: int = 8,
) -> dict:
    """`npu bench gemm --backend rtl`: the GEMM sweep plus the pause latency of a GEMM with a
    cancellation point every `pause_interval_tiles` output tiles."""
    from npu.sim.rtl.core import run_rtl

    result = bench_gemm_rtl(cfg, sizes, fast_dram=fast_dram)
    size = max(sizes)
    job, *_ = gemm_job(cfg, size, cancel_every=pause_interval_tiles)
    n_gap, drain, tight, cp_times = pause_figures(cfg, job)
    total = cp_times[-1] if cp_times else 0
    jobs = []
    requests = [int(total * (i + 0.5) / pause_samples) for i in range(pause_samples)]
    for t in requests:
        j, *_ = gemm_job(cfg, size, cancel_every=pause_interval_tiles)
        j.pause_at = [t]
        jobs.append(j)
    recs = run_rtl(cfg, jobs, fast_dram=fast_dram)
    lat = []
    for t, r in zip(requests, recs, strict=True):
        if r.pauses and r.run_cycles:
            lat.append(r.run_cycles[0] - t)
    result.update(
        {
            "pause_interval_n": n_gap,
            "drain_bound": drain,
            "pause_requests": requests,
            "pause_latencies": lat,
            "pause_latency_max": max(lat) if lat else None,
            "pause_latency_bound": tight,
            "pause_bound_ok": bool(lat) and max(lat) <= min(n_gap + drain, tight) + 8,
        }
    )
    return result


def format_model(result: dict) -> str:
    """`bench_model`'s figures as text."""
    g = result["gemm"]
    return (
        f"GEMM {g['m']}x{g['n']}x{g['k']} on {result['config']}: {g['cycles']:,} cycles "
        f"(ideal {g['ideal_cycles']:,.0f}, utilization {g['utilization']:.3f}), "
        f"simulated in {g['wall_s']:.3f} s = {result['sim_cycles_per_s']:,.0f} cycles/s, "
        f"bit-exact: {g['bit_exact']}"
    )


def format_rtl(result: dict) -> str:
    """`bench_rtl`'s figures as text."""
    lines = [
        f"GEMM {g['m']}^3: {g['cycles']:,} cycles (ideal {g['ideal_cycles']:,.0f}, "
        f"utilization {g['utilization']:.3f}), model {g['model_cycles']:,} "
        f"(error {g['model_error']:.3%}), bit-exact: {g['bit_exact']}"
        for g in result["gemm"]
    ]
    lines.append(
        f"simulation: {result['sim_cycles_per_s']:,.0f} cycles/s; pause latency max "
        f"{result['pause_latency_max']} cycles with points every N = {result['pause_interval_n']} "
        f"cycles and drain bound {result['drain_bound']}"
    )
    return "\n".join(lines)
