"""The matrix unit's int16 A on the RTL: bit-exact against numpy and the golden model for ragged and
short k, the busy cycles the golden model's timing counts, and the rate: with `a16_full_rate`
(`default`, and banked configurations whose second A word of a step comes through the banks'
other port) an int16 MATMUL takes int8's steps, without it (`tiny`, `banked`) twice as many; with
A rows staged in the matrix unit (`ulx3s128s`, and in chunks) int8's steps and the staging of its
twice as many bytes where a fill is not hidden behind the steps."""

import numpy as np
import pytest

from npu.arith import round_up
from npu.config import get_config
from npu.isa import encode_program
from npu.program import ProgramBuilder
from npu.sim.rtl.core import RtlJob, compare, run_model, run_rtl

pytestmark = pytest.mark.rtl

A_DRAM, B_DRAM, C_DRAM = 0x1000, 0x6000, 0xA000
M, N = 9, 11  # ragged tiles on every preset


def _job(cfg, k: int, e: int) -> tuple[RtlJob, np.ndarray, np.ndarray]:
    """C = A . B^T for A (M x k) of `e`-byte elements and B^T (N x k) int8."""
    half = cfg.spad_bytes // 2
    a_stride = round_up(e * k, cfg.lanes) + cfg.lanes  # not a multiple of the banks
    b_stride = round_up(k, cfg.lanes) + cfg.lanes
    c_stride = 4 * round_up(N, cfg.pes_per_cluster)
    rng = np.random.default_rng(1000 * k + e)
    dt = np.int16 if e == 2 else np.int8
    info = np.iinfo(dt)
    a = rng.integers(info.min, info.max + 1, (M, k), dtype=dt)
    bt = rng.integers(-128, 128, (N, k), dtype=np.int8)
    b = ProgramBuilder(cfg)
    b.add("load", spad=0, dram=A_DRAM, rows=M, cols=e * k, spad_stride=a_stride, dram_stride=e * k)
    b.add("load", spad=half, dram=B_DRAM, rows=N, cols=k, spad_stride=b_stride, dram_stride=k)
    b.add("matmul", a=0, b=half, c=0x80000, m=M, n=N, k=k, a_stride=a_stride, b_stride=b_stride,
          c_stride=c_stride, a_i16=int(e == 2))  # fmt: skip
    b.add("store", spad=0x80000, dram=C_DRAM, rows=M, cols=4 * N, spad_stride=c_stride, dram_stride=4 * N)
    data = {A_DRAM: a.astype(f"<i{e}").tobytes(), B_DRAM: bt.tobytes()}
    job = RtlJob(f"k{k}-i{8 * e}", encode_program(b.build().instrs), 0xC000, dram=data, window=0xC000)
    return job, a, bt


#: `banked` with int16 A at the int8 rate: a step's 8 A words and 4 B words on 5 banks a region
#: conflict, which the model's timing must count
BANKED_FULL = get_config("banked").replace(name="banked-full", a16_full_rate=True)
#: the board's 32-MAC preset at the int8 rate: two clusters' second A words on two banks' port B
ULX3S32_FULL = get_config("ulx3s32").replace(name="ulx3s32-full", a16_full_rate=True)


#: the 128-MAC board preset's staged A rows in chunks of two pairs: every k >= 2 * lanes + 1 a
#: chunk more, its C rows added to the chunk's before
ULX3S128S_CHUNKS = get_config("ulx3s128s").replace(name="ulx3s128s-chunks", a_stage_bytes=32)


@pytest.mark.parametrize(
    "config",
    ["tiny", "default", "banked", BANKED_FULL, ULX3S32_FULL, "ulx3s128s", ULX3S128S_CHUNKS],
    ids=lambda c: getattr(c, "name", c),
)
def test_int16_matmuls_are_exact_and_take_the_steps_the_model_counts(config):
    cfg = get_config(config)
    L = cfg.lanes
    ks = [1, L // 2, L // 2 + 1, L, 3 * L + 1, 8 * L]
    cases = [(k, e, *_job(cfg, k, e)) for k in ks for e in (1, 2)]
    recs = run_rtl(cfg, [job for _, _, job, _, _ in cases])
    busy = {}
    for (k, e, job, a, bt), rec in zip(cases, recs, strict=True):
        model = run_model(cfg, job)
        assert model.status == "DONE", (job.name, model.status, model.error_code)
        assert not compare(model, rec), (job.name, compare(model, rec))
        got = np.frombuffer(rec.dram[C_DRAM : C_DRAM + 4 * M * N], "<i4").reshape(M, N)
        assert np.array_equal(got, a.astype(np.int64) @ bt.astype(np.int64).T), job.name
        rtl, want = rec.counters["BUSY_MATRIX"], model.counters["BUSY_MATRIX"]
        assert abs(rtl - want) <= 0.05 * want + 2, (job.name, rtl, want)
        busy[k, e] = rtl
    k = 8 * L  # long enough that the pipeline's latency is small beside the steps
    ratio = busy[k, 2] / busy[k, 1]
    if cfg.a_stage_bytes:  # int8's steps; only the staging of twice the bytes a row costs more
        # (in chunks, the int16 row's further chunks add their C rows: the per-case check above)
        # the first m tile's fill waits for nothing and nothing waits beside it; the second
        # tile's (one row) runs while the first tile's steps do, double-buffered
        if 2 * k <= cfg.a_stage_bytes:
            pairs = min(M, cfg.clusters) * (k - k // 2) // L  # the pairs int16 stages more in it
            assert abs(busy[k, 2] - busy[k, 1] - pairs) <= 3, (cfg.name, busy, pairs)
    elif not cfg.a16_full_rate:
        assert ratio >= 1.7, (cfg.name, busy)
    else:  # the step's second A words through the banks' other port: on strides off the banks'
        # period no bank serves two reads of one port, so int16 takes int8's steps, banked or not
        assert ratio <= 1.1, (cfg.name, busy)
