"""Benchmarks of the golden model (`npu bench model`)."""

from __future__ import annotations

import time

import numpy as np

from npu.config import NpuConfig
from npu.isa import encode_program

from .model import NpuModel
from .programs import choose_tiling, gemm_program, gemm_reference, requant_params
from .timing import ideal_matmul_cycles


def bench_gemm(cfg: NpuConfig, m: int, n: int, k: int, *, seed: int = 0) -> dict:
    """Run one tiled GEMM on the model; figures plus a bit-exactness check against numpy."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    bt = rng.integers(-128, 128, (n, k), dtype=np.int8)
    mult, shift = requant_params(k)
    a_addr = 0x10000
    b_addr = a_addr + -(-m * k // 4096) * 4096
    c_addr = b_addr + -(-n * k // 4096) * 4096
    p_addr = c_addr + -(-m * n // 4096) * 4096
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
