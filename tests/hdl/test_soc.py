"""NpuSoc in cocotb: engines run different programs at the same time over one DRAM port.

Each engine's job lives in its own DRAM region; the result of every engine must be bit-identical to
the same job run alone on the golden model of one engine, and to the golden model of the SoC
(`NpuSystem`), with every AXI channel stalling at random. One engine is preempted (paused at a
cancellation point and resumed, or paused at every point) while the others run.
"""

import numpy as np
import pytest

from npu.config import get_config
from npu.registers import SOC_MAGIC, Status
from npu.sim.rtl.core import run_model
from npu.sim.rtl.gemm_bench import gemm_job
from npu.sim.rtl.soc import offset_job, run_soc_rtl
from npu.sim.rtl.soc_bench import model_round
from npu.sim.rtl.suite import random_jobs

pytestmark = [pytest.mark.rtl, pytest.mark.xdist_group("rtl-soc")]

REGION = 0x4000  # DRAM bytes per engine's job (a random program's window)


def soc_config(engines: int):
    return get_config("tiny").replace(name=f"tiny-x{engines}", engines=engines, dram_bytes=128 * 1024)


def random_rounds(cfg, seeds_per_round: list[list[int]], pause: dict[int, str] | None = None):
    rounds = []
    for seeds in seeds_per_round:
        jobs = random_jobs(cfg.engine, seeds, cp_prob=0.3)
        rnd = {}
        for e, job in enumerate(jobs):
            job = offset_job(job, REGION * e, f"e{e}-{job.name}")
            if pause and e in pause:
                job.pause = pause[e]
            rnd[e] = job
        rounds.append(rnd)
    return rounds


def check_round(cfg, rnd, rec, *, check_system: bool = True) -> None:
    failures = []
    for e, job in rnd.items():
        lo, hi = job.window - REGION, job.window  # this engine's region
        alone = run_model(cfg.engine, job)
        got = rec.engines[e].run
        if got.status != alone.status or got.dram[lo:hi] != alone.dram[lo:hi]:
            a, b = np.frombuffer(alone.dram[lo:hi], np.uint8), np.frombuffer(got.dram[lo:hi], np.uint8)
            failures.append(
                f"engine {e} ({job.name}): status rtl {got.status} alone {alone.status}; "
                f"{int((a != b).sum())} DRAM bytes differ"
            )
        if job.pause == "every" and got.pauses != alone.pauses:
            failures.append(f"engine {e}: paused at {got.pauses}, alone at {alone.pauses}")
    if check_system:
        s = model_round(cfg, rnd, {e: r.start for e, r in rec.engines.items()})
        window = len(rec.dram)
        if s.read_dram(0, window) != rec.dram:
            failures.append("the SoC model's DRAM differs from the RTL's")
        for e in rnd:
            if s.engines[e].status.name != rec.engines[e].run.status:
                failures.append(f"engine {e}: SoC model {s.engines[e].status.name}")
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def two_engines():
    """Two engines on cocotbext-axi's AxiRam (protocol-checked, every channel stalling): four rounds
    of random programs; engine 0 pauses at every point in the third; in the fourth engine 1 is
    asked to pause mid-run while engine 0 runs."""
    cfg = soc_config(2)
    seeds = [[10, 11], [12, 13], [14, 15], [16, 17]]
    rounds = random_rounds(cfg, seeds[:2]) + random_rounds(cfg, [seeds[2]], {0: "every"})
    last = random_rounds(cfg, [seeds[3]])[0]
    mid = run_model(cfg.engine, last[1]).counters["CYCLES"] // 2
    last[1].pause_at = [mid]
    rounds.append(last)
    return cfg, rounds, run_soc_rtl(cfg, rounds, stalls=True)


def test_soc_block_identifies_itself(two_engines):
    cfg, rounds, res = two_engines
    assert res.ident == {"SOC_ID": SOC_MAGIC, "ENGINES": 2}
    # both engines stopped with IRQ_ENABLE set: both lines up in IRQ_STATUS
    assert [r.irq_status for r in res.rounds] == [0b11] * len(rounds)


def test_two_engines_bit_exact_under_backpressure(two_engines):
    cfg, rounds, res = two_engines
    for rnd, rec in zip(rounds, res.rounds, strict=True):
        check_round(cfg, rnd, rec)
    # the engines really overlapped: each started before the other finished
    for rec in res.rounds:
        a, b = rec.engines[0], rec.engines[1]
        assert a.start < b.stop and b.start < a.stop


def test_preempting_one_engine_while_the_other_runs(two_engines):
    cfg, rounds, res = two_engines
    every, paused = res.rounds[2], res.rounds[3]
    assert len(every.engines[0].run.pauses) >= 1 and every.engines[1].run.pauses == []
    assert len(paused.engines[1].run.pauses) == 1, "engine 1 was not paused mid-run"
    assert paused.engines[1].run.status == Status.DONE.name
    # the other engine ran on while engine 1 was paused and resumed
    assert paused.engines[0].run.pauses == [] and paused.engines[0].run.status == Status.DONE.name


def test_four_engines_random_and_gemm_bit_exact():
    """Four engines on the in-simulator RAM (stalling at random): a round of random programs, then
    a round of GEMMs of different sizes, checked against numpy as well."""
    cfg = soc_config(4)
    rounds = random_rounds(cfg, [[20, 21, 22, 23]])
    gemms, refs = {}, {}
    for e, size in enumerate((16, 24, 32, 20)):
        job, ref, c_addr, _ = gemm_job(cfg.engine, size, seed=e)
        off = 0x8000 * e
        assert job.window <= 0x8000
        gemms[e] = offset_job(job, off, f"e{e}-gemm{size}")
        refs[e] = (ref, c_addr + off)
    rounds.append(gemms)
    res = run_soc_rtl(cfg, rounds, fast_dram=True, stalls=True)
    check_round(cfg, rounds[0], res.rounds[0])
    for e, (ref, addr) in refs.items():
        got = np.frombuffer(res.rounds[1].dram[addr : addr + ref.size], np.int8).reshape(ref.shape)
        assert np.array_equal(got, ref), f"engine {e}: GEMM result differs from numpy"
        assert res.rounds[1].engines[e].run.status == Status.DONE.name
