"""The golden model of the SoC: register map, shared DRAM, and the shared-port timing rule."""

import pytest

from npu.config import get_config
from npu.registers import REG, SOC_MAGIC, SOC_REG, Status, engine_window
from npu.sim.golden.system import Channel
from npu.sim.rtl.core import run_model
from npu.sim.rtl.soc import offset_job
from npu.sim.rtl.soc_bench import contended_round, model_round, stream_job
from npu.sim.rtl.suite import random_jobs


def soc(n):
    return get_config("tiny").replace(name=f"tiny-x{n}", engines=n, dram_bytes=512 * 1024)


def test_register_map():
    from npu.sim.golden.system import NpuSystem

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
    from npu.sim.golden.system import NpuSystem

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
    from npu.sim.golden.model import NpuModel

    duo = get_config("duo")
    assert NpuModel(duo).cfg == get_config("default")
    assert NpuModel(duo).read_reg(REG["CONFIG_ID"].offset) == get_config("default").config_id


def _pair(bursts_a, beats_a, bursts_b, beats_b, t_b=0):
    """Two engines' transfers on a channel without overhead; the delays each ends up with."""
    ch = Channel(accepted=1, overhead=0, lead=0)
    moved = []
    a = ch.transfer("A", bursts_a, bursts_a * beats_a, 0)
    a.retime = lambda extra, now: moved.append((extra, now)) or True
    b = ch.transfer("B", bursts_b, bursts_b * beats_b, t_b)
    return a, b, moved


def test_channel_shares_equal_bursts_evenly():
    # 10 bursts of 8 beats each, started together: each waits for about the other's 80 beats
    a, b, moved = _pair(10, 8, 10, 8)
    assert 70 <= a.delay <= 80 and 70 <= b.delay <= 84
    assert moved and moved[0][1] == 0  # the running transfer's end was moved when B started


def test_channel_shares_by_burst_length():
    # 8 bursts of 4 beats next to a stream of 32-beat bursts: one short burst per long one
    a, b, _ = _pair(64, 32, 8, 4)
    assert 7 * 32 <= b.delay <= 9 * 32  # about one long burst per short one
    assert 28 <= a.delay <= 36  # the stream waits for the short bursts only


def test_channel_transfer_alone_and_after_the_owners_last_does_not_wait():
    ch = Channel(accepted=5, overhead=2, lead=2)
    assert ch.transfer("A", 16, 512, 0).delay == 0
    # the engine's next transfer replaces its previous one, whatever the channel still held of it
    assert ch.transfer("A", 16, 512, 100).delay == 0
    assert ch.waited == 0


@pytest.mark.parametrize("n", [2, 4])
def test_moved_ends_stay_consistent(n):
    """Ends moved by later transfers keep each unit's instructions in order, and the trace's
    durations add up to the busy counters."""
    cfg = soc(n)
    rnd = contended_round(cfg)
    s = model_round(cfg, rnd, dict.fromkeys(rnd, 0), trace=True)
    assert sum(s.port.waited.values()) > 0
    for e in s.engines:
        for unit, counter in (("load", "BUSY_LOAD"), ("store", "BUSY_STORE"), ("matrix", "BUSY_MATRIX")):
            evs = [ev for ev in e.trace if ev.unit == unit and not ev.op.startswith("pass")]
            assert sum(ev.end - ev.start for ev in evs) == e.counters[counter]
            for prev, nxt in zip(evs, evs[1:], strict=False):
                assert nxt.start >= prev.end, (unit, prev, nxt)


def test_a_transfer_is_retimed_only_while_its_instruction_is_the_units_latest():
    """A later instruction on the same unit has started: the earlier one's end can no longer move."""
    from npu.isa import encode_program, make
    from npu.program import ProgramBuilder
    from npu.sim.golden.model import NpuModel
    from npu.sim.golden.system import Transfer

    class Port:  # hands out transfers without delays, keeps them
        def __init__(self):
            self.xfers = []

        def transfer(self, owner, ins, t):
            self.xfers.append(Transfer(owner, 1, 1, t, t))
            return self.xfers[-1]

    cfg = get_config("tiny")
    b = ProgramBuilder(cfg)
    for k in range(2):
        b.add(make("store", spad=0, dram=0x1000 + 256 * k, rows=4, cols=64, dram_stride=64, spad_stride=64))
    m = NpuModel(cfg)
    m.port = Port()
    m.load_program(encode_program(b.build().instrs), 0x4000)
    m.start(pc=0)
    while len(m.port.xfers) < 2:
        t, action = m.next_event()
        action()
    first, second = m.port.xfers
    end = m.counters["BUSY_STORE"]
    assert not first.retime(50, t)  # the second store runs: the first is over
    assert second.retime(50, t) and m.counters["BUSY_STORE"] == end + 50
    m.run()
    assert m.status == Status.DONE
