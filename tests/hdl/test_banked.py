"""The banked scratchpad on the RTL: conflicting operand reads stall the matrix unit for as many
cycles as the golden model's timing counts, and the results stay bit-exact."""

import numpy as np
import pytest

from npu.config import get_config
from npu.isa import encode_program
from npu.program import ProgramBuilder
from npu.sim.rtl.core import RtlJob, compare, run_model, run_rtl

pytestmark = pytest.mark.rtl

CFG = get_config("banked")
M = N = K = 64
A_DRAM, B_DRAM, C_DRAM = 0x1000, 0x3000, 0x8000


def _job(stride: int, c_stride: int = 4 * N + CFG.bus_bytes) -> RtlJob:
    """C = A . B^T with A rows in the lower half and B^T rows in the upper half, `stride` bytes apart,
    C rows `c_stride` bytes apart in the accumulators."""
    half = CFG.spad_bytes // 2
    b = ProgramBuilder(CFG)
    b.add("load", spad=0, dram=A_DRAM, rows=M, cols=K, spad_stride=stride, dram_stride=K)
    b.add("load", spad=half, dram=B_DRAM, rows=N, cols=K, spad_stride=stride, dram_stride=K)
    b.add(
        "matmul", a=0, b=half, c=0x80000, m=M, n=N, k=K, a_stride=stride, b_stride=stride, c_stride=c_stride
    )
    b.add("store", spad=0x80000, dram=C_DRAM, rows=M, cols=4 * N, spad_stride=c_stride, dram_stride=4 * N)
    rng = np.random.default_rng(stride)
    a = rng.integers(-128, 128, (M, K), dtype=np.int8)
    bt = rng.integers(-128, 128, (N, K), dtype=np.int8)
    return (
        RtlJob(
            f"stride{stride}-{c_stride}",
            encode_program(b.build().instrs),
            0x20000,
            dram={A_DRAM: a.tobytes(), B_DRAM: bt.tobytes()},
            window=0x10000,
        ),
        a,
        bt,
    )


def test_bank_conflicts_stall_as_the_model_counts():
    # 9 lane words apart: the four rows of a tile sit in four of the five banks of their half;
    # 10 lane words apart: all four in one bank, four cycles a step; C rows 20 accumulator rows
    # apart: all four in one accumulator bank, written one a cycle
    W = CFG.bus_bytes
    jobs = {
        "free": _job(9 * CFG.lanes),
        "operands": _job(10 * CFG.lanes),
        "c rows": _job(9 * CFG.lanes, 20 * W),
    }
    recs = run_rtl(CFG, [j for j, _, _ in jobs.values()])
    cycles = {}
    for (what, (job, a, bt)), rec in zip(jobs.items(), recs, strict=True):
        model = run_model(CFG, job)
        assert not compare(model, rec), what
        got = np.frombuffer(rec.dram[C_DRAM : C_DRAM + 4 * M * N], "<i4").reshape(M, N)
        assert np.array_equal(got, a.astype(np.int32) @ bt.astype(np.int32).T)
        assert (
            abs(rec.counters["BUSY_MATRIX"] - model.counters["BUSY_MATRIX"])
            <= 0.05 * model.counters["BUSY_MATRIX"]
        ), (what, rec.counters, model.counters)
        cycles[what] = rec.counters["BUSY_MATRIX"]
    tiles = (M // CFG.clusters) * (N // CFG.pes_per_cluster)
    steps = tiles * (K // CFG.lanes)
    assert cycles["free"] < 1.1 * steps and cycles["operands"] > 3.5 * steps, cycles
    assert cycles["c rows"] - cycles["free"] >= 3 * tiles - 8, cycles


def test_a_store_the_dram_waits_on_reads_before_a_matmul_that_takes_every_bank():
    """On the ULX3S preset an int16 MATMUL reads both banks of its A region (a step's two A words) and
    both of its B region (the two PEs' rows) every cycle. A STORE beside it whose write burst has
    begun reads ahead of the matrix unit (`split_urgent`, hdl/core.py): it ends long before the
    MATMUL, which it slows by about its own words, instead of holding the DRAM - on the board the
    SDRAM every unit shares - until the MATMUL is over."""
    cfg = get_config("ulx3s")
    half = cfg.spad_bytes // 2
    m, n, k = 32, 32, 64
    b = ProgramBuilder(cfg)
    b.add("load", spad=0, dram=A_DRAM, rows=m, cols=2 * k, spad_stride=2 * k, dram_stride=2 * k)
    # B^T rows 9 lane words apart: the two PEs' rows in the region's two banks
    b.add("load", spad=half, dram=B_DRAM, rows=n, cols=k, spad_stride=9 * cfg.lanes, dram_stride=k)
    b.add("matmul", a=0, b=half, c=0x80000, m=m, n=n, k=k, a_stride=2 * k, b_stride=9 * cfg.lanes, a_i16=1)
    # B's first rows back to DRAM: the store waits for the same LOAD as the MATMUL, so both start then
    b.add("store", spad=half, dram=C_DRAM, rows=16, cols=64, spad_stride=9 * cfg.lanes, dram_stride=64)
    rng = np.random.default_rng(5)
    a = rng.integers(-(1 << 15), 1 << 15, (m, k), dtype=np.int16)
    bt = rng.integers(-128, 128, (n, k), dtype=np.int8)
    job = RtlJob(
        "urgent-store",
        encode_program(b.build().instrs),
        0x20000,
        dram={A_DRAM: a.tobytes(), B_DRAM: bt.tobytes()},
        window=0x10000,
    )
    (rec,) = run_rtl(cfg, [job])
    model = run_model(cfg, job)
    assert not compare(model, rec)
    assert rec.dram[C_DRAM : C_DRAM + 16 * 64] == bt[:16].tobytes()
    busy = {u: rec.counters[f"BUSY_{u}"] for u in ("MATRIX", "STORE")}
    steps = m * (n // cfg.pes_per_cluster) * (k // cfg.lanes)
    assert busy["MATRIX"] >= steps, busy  # the MATMUL is long: a step a cycle at best
    assert busy["STORE"] < 0.2 * busy["MATRIX"], busy  # the store did not wait for it
    # the matrix unit lost about the store's 128 words, not more
    assert busy["MATRIX"] <= model.counters["BUSY_MATRIX"] + 16 * 64 // cfg.bus_bytes + 16, busy
