"""The golden model of the SoC: register map, shared DRAM, and the shared-port timing rule."""

import pytest

from npu.config import get_config
from npu.registers import REG, SOC_MAGIC, SOC_REG, Status, engine_window
from npu.sim.rtl import run_model
from npu.sim.rtl_suite import random_jobs
from npu.sim.soc import offset_job
from npu.sim.soc_bench import contended_round, model_round, stream_job


def soc(n):
    return get_config("tiny").replace(name=f"tiny-x{n}", engines=n, dram_bytes=512 * 1024)


def test_register_map():
    from npu.sim.system import NpuSystem

    s = NpuSystem(soc(2))
    assert s.read_reg(SOC_REG["SOC_ID"].offset) == SOC_MAGIC
    assert s.read_reg(SOC_REG["ENGINES"].offset) == 2
    assert s.read_reg(SOC_REG["SOC_CONFIG_ID"].offset) == soc(2).config_id
    # each engine reports the one-engine configuration a model is compiled for
    assert s.read_reg(engine_window(1) + REG["CONFIG_ID"].offset) == soc(2).engine.config_id
    assert s.read_reg(engine_window(2) + REG["ID"].offset) == 0  # past the last engine: unmapped
    assert s.read_reg(SOC_REG["IRQ_MASK"].offset) == 0b11
    s.write_reg(SOC_REG["IRQ_MASK"].offset, 0xFFFF_FFFE)
    assert s.read_reg(SOC_REG["IRQ_MASK"].offset) == 0b10


def test_engines_share_dram_and_interrupts():
    from npu.sim.system import NpuSystem

    cfg = soc(2)
    jobs = [offset_job(j, 0x4000 * e) for e, j in enumerate(random_jobs(cfg.engine, [5, 6]))]
    s = NpuSystem(cfg)
    for e, job in enumerate(jobs):
        for a, v in job.memory().items():
            s.write_dram(a, v)
        base = engine_window(e)
        s.write_reg(base + REG["PROGRAM_BASE"].offset, job.base)
        s.write_reg(base + REG["CONTROL"].offset, 0b1001)  # START | IRQ_ENABLE
    s.write_reg(SOC_REG["IRQ_MASK"].offset, 0b10)
    first = s.run_until_stop()
    assert first in (0, 1) and s.engines[first].status == Status.DONE
    s.run()
    assert s.read_reg(SOC_REG["IRQ_STATUS"].offset) == 0b11 and s.irq
    s.write_reg(engine_window(1) + REG["IRQ"].offset, 1)
    assert s.read_reg(SOC_REG["IRQ_STATUS"].offset) == 0b01 and not s.irq  # engine 0 is masked
    for e, job in enumerate(jobs):
        alone = run_model(cfg.engine, job)
        lo = 0x4000 * e
        assert s.read_dram(lo, job.window - lo) == alone.dram[lo:], f"engine {e}"


def test_one_engine_keeps_single_engine_timing():
    cfg = soc(1)
    job = stream_job(cfg.engine, 8)
    s = model_round(cfg, {0: job}, {0: 0})
    assert s.engines[0].counters["CYCLES"] == run_model(cfg.engine, job).counters["CYCLES"]
    assert s.port.waited == {op: 0 for op in s.port.waited}


@pytest.mark.parametrize("n", [2, 4])
def test_contention_slows_engines_down_and_keeps_data(n):
    cfg = soc(n)
    rnd = contended_round(cfg)
    s = model_round(cfg, rnd, dict.fromkeys(rnd, 0))
    slower = 0
    for e, job in rnd.items():
        alone = run_model(cfg.engine, job)
        assert s.engines[e].status == Status.DONE
        assert s.read_dram(0x10000 * e, job.window - 0x10000 * e) == alone.dram[0x10000 * e :]
        assert s.engines[e].counters["CYCLES"] >= alone.counters["CYCLES"]
        slower += s.engines[e].counters["CYCLES"] > alone.counters["CYCLES"]
    assert slower >= 1 and sum(s.port.waited.values()) > 0


def test_a_model_for_one_engine_runs_on_every_engine_of_a_soc_preset():
    """A SoC preset compiles for, and models, one of its engines: the ids agree."""
    from npu.sim.model import NpuModel

    duo = get_config("duo")
    assert NpuModel(duo).cfg == get_config("default")
    assert NpuModel(duo).read_reg(REG["CONFIG_ID"].offset) == get_config("default").config_id
