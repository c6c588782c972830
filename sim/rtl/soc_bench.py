"""`npu bench soc`: the SoC's RTL against its golden model (`NpuSystem`) with engines contending for
the DRAM port, for 2 and 4 engines.

Each engine runs a different job at the same time: GEMMs of different sizes (compute-heavy) and
streaming copies (DMA only, both channels busy), so the port is contended. The figures: per engine
the cycles on the RTL, on the SoC model (started at the cycles the bench started each engine) and
alone on one engine's model; the relative error of the model per engine and of the round's makespan.
"""

from __future__ import annotations

import time

import numpy as np

from npu.config import NpuConfig
from npu.isa import encode_program, make
from npu.program import ProgramBuilder
from npu.sim.golden.system import NpuSystem
from npu.sim.rtl.core import RtlJob, run_model
from npu.sim.rtl.gemm_bench import gemm_job
from npu.sim.rtl.soc import Round, offset_job, run_soc_rtl

REGION = 0x10000  # DRAM bytes per engine


def stream_job(cfg: NpuConfig, kib: int, seed: int = 0, row: int = 256) -> RtlJob:
    """A streaming copy of `kib` KiB through two scratchpad buffers (loads overlap stores)."""
    src, dst, prog = 0x1000, 0x1000 + 1024 * kib, 0x1000 + 2048 * kib
    rows = max(1, min(16, cfg.spad_bytes // (4 * row)))
    chunk = rows * row
    b = ProgramBuilder(cfg)
    for i in range(1024 * kib // chunk):
        spad = (i % 2) * chunk
        b.add(
            make(
                "load", spad=spad, dram=src + i * chunk, rows=rows, cols=row, dram_stride=row, spad_stride=row
            )
        )
        b.add(
            make(
                "store",
                spad=spad,
                dram=dst + i * chunk,
                rows=rows,
                cols=row,
                dram_stride=row,
                spad_stride=row,
            )
        )
    blob = encode_program(b.build().instrs)
    data = np.random.default_rng(seed).integers(0, 256, 1024 * kib, dtype=np.uint8).tobytes()
    return RtlJob(f"stream{kib}k", blob, prog, {src: data}, window=prog + len(blob))


def contended_round(cfg: NpuConfig) -> Round:
    """One job per engine: GEMMs and streams of different sizes, each in its own DRAM region."""
    one = cfg.engine
    kinds = [("gemm", 32), ("stream", 16), ("gemm", 48), ("stream", 8)]
    rnd: Round = {}
    for e in range(cfg.engines):
        kind, size = kinds[e % len(kinds)]
        job = gemm_job(one, size, seed=e)[0] if kind == "gemm" else stream_job(one, size, seed=e)
        if job.window > REGION:
            raise ValueError(f"{job.name} needs 0x{job.window:x} bytes of DRAM, more than 0x{REGION:x}")
        rnd[e] = offset_job(job, REGION * e, f"e{e}-{job.name}")
    return rnd


def model_round(cfg: NpuConfig, rnd: Round, starts: dict[int, int], trace: bool = False) -> NpuSystem:
    """The round on the SoC model, each engine started at `starts[e]`."""
    s = NpuSystem(cfg, trace=trace)
    for job in rnd.values():
        for a, v in job.memory().items():
            s.write_dram(a, v)
    for e in sorted(rnd, key=starts.get):
        s.advance(max(0, starts[e] - s.now))
        s.engines[e].program_base = rnd[e].base
        s.engines[e].start(pc=0)
    s.run()
    return s


def bench_soc(cfg: NpuConfig, engines=(2, 4)) -> dict:
    """Model vs RTL under contention for each engine count (configurations of `cfg.engine`)."""
    one = cfg.engine
    out = []
    t0 = time.perf_counter()
    for n in engines:
        soc = one.replace(name=f"{one.name}-x{n}", engines=n, dram_bytes=max(one.dram_bytes, REGION * 4 * 2))
        rnd = contended_round(soc)
        rec = run_soc_rtl(soc, [rnd], fast_dram=True).rounds[0]
        starts = {e: r.start for e, r in rec.engines.items()}
        sysm = model_round(soc, rnd, starts)
        rows = []
        for e, job in rnd.items():
            rtl = rec.engines[e].run.counters["CYCLES"]
            model = sysm.engines[e].counters["CYCLES"]
            rows.append(
                {
                    "engine": e,
                    "job": job.name,
                    "rtl_cycles": rtl,
                    "model_cycles": model,
                    "alone_cycles": run_model(soc.engine, job).counters["CYCLES"],
                    "error": round(abs(model - rtl) / rtl, 6),
                    "status": rec.engines[e].run.status,
                }
            )
        rtl_span = max(starts[e] + r["rtl_cycles"] for e, r in zip(rnd, rows, strict=True))
        model_span = max(starts[e] + r["model_cycles"] for e, r in zip(rnd, rows, strict=True))
        lo = min(starts.values())
        rtl_span, model_span = rtl_span - lo, model_span - lo
        out.append(
            {
                "engines": n,
                "config": soc.name,
                "jobs": rows,
                "rtl_makespan": rtl_span,
                "model_makespan": model_span,
                "makespan_error": round(abs(model_span - rtl_span) / rtl_span, 6),
                "max_engine_error": max(r["error"] for r in rows),
                "bit_exact": sysm.read_dram(0, len(rec.dram)) == rec.dram,
                # how much the port slowed the engines down on the RTL (vs each job alone on the model)
                "contention_slowdown": round(
                    sum(r["rtl_cycles"] for r in rows) / sum(r["alone_cycles"] for r in rows), 4
                ),
            }
        )
    return {"backend": "rtl", "config": one.name, "runs": out, "wall_s": round(time.perf_counter() - t0, 3)}


def format_soc(result: dict) -> str:
    lines = []
    for r in result["runs"]:
        lines.append(
            f"{r['engines']} engines of {result['config']}: makespan RTL {r['rtl_makespan']:,}, model "
            f"{r['model_makespan']:,} (error {r['makespan_error']:.2%}); worst engine error "
            f"{r['max_engine_error']:.2%}; slowdown from contention {r['contention_slowdown']:.2f}x; "
            f"bit-exact: {r['bit_exact']}"
        )
        for j in r["jobs"]:
            lines.append(
                f"  engine {j['engine']} {j['job']}: RTL {j['rtl_cycles']:,}, model {j['model_cycles']:,} "
                f"(error {j['error']:.2%}), alone {j['alone_cycles']:,}"
            )
    return "\n".join(lines)
