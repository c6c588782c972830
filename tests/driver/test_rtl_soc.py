"""The driver on the RTL SoC (cocotb + Verilator): two engines of `tiny` sharing the in-simulator DRAM,
jobs of an operator-granularity model spread over both by the expected-time operator queues; outputs
bit-identical to one engine of the golden model, device time close to the SoC's golden model."""

import numpy as np
import pytest

from npu.compiler import compile_onnx
from npu.config import get_config
from npu.driver import Npu
from npu.registers import SOC_REG, Control
from npu.sim.rtl.transport import run_on_rtl
from tests.driver.conftest import small_cnn

pytestmark = [pytest.mark.rtl, pytest.mark.xdist_group("rtl-soc-driver")]

JOBS = 4


def soc_config():
    """Two engines of `tiny`: not a named preset (its name stays `tiny`)."""
    return get_config("tiny").replace(engines=2)


@pytest.fixture(scope="module")
def operator_model(tmp_path_factory):
    """The small CNN of tests/driver/conftest.py, one segment per operator, and JOBS inputs."""
    d = tmp_path_factory.mktemp("soc_small")
    path, calib = small_cnn(d)
    # int8: two engines' jobs of it at once fit tiny's 64 KiB of DRAM (int16 activations would not)
    c = compile_onnx(path, "tiny", calib=calib, granularity="operator", activations="int8").to_container()
    xs = [np.random.default_rng(10 + k).normal(size=(1, 8, 16, 16)).astype(np.float32) for k in range(JOBS)]
    return c, xs


def submit_all(npu, c, xs):
    """Load two instances (two jobs at once), submit every input at once, run them all: outputs,
    engines used per job, busy cycles per engine, device cycles from the first submission to the end."""
    m = npu.load(c, instances=2)
    t0 = npu.tr.now()
    jobs = [m.submit(x, int8=True) for x in xs]
    npu.run_all()
    cycles = npu.tr.now() - t0
    return [j.outputs[0] for j in jobs], [sorted(j.engines_used) for j in jobs], npu.utilization(), cycles


def start(view, base: int) -> None:
    view.set_reg("DRAM_BASE", 0)  # no memory window (the Npu left its last job's)
    view.set_reg("DRAM_LIMIT", 0)
    view.set_reg("PROGRAM_BASE", base)
    view.set_reg("RESUME_PC", 0)
    view.set_reg("CONTROL", int(Control.START | Control.IRQ_ENABLE))


def wait_checks(tr) -> dict:
    """Runs inside the simulation, on idle engines: what `wait` does when another engine's interrupt
    is pending and uncleared, when the running engine's own is stale, and with nothing running."""
    from npu.driver.transport import EngineView
    from npu.sim.rtl.cocotb_bench import clear_program

    clear = clear_program(tr.cfg.engine)  # two padding-only loads (~2.5k cycles on tiny) and END
    body, end = clear[:-32], clear[-32:]
    short, long = 0, 0x400
    tr.write_dram(short, clear)
    tr.write_dram(long, body * 6 + end)
    e0, e1 = EngineView(tr, 0), EngineView(tr, 1)
    out = {}
    # engine 0 runs and stops; its interrupt stays pending (not cleared)
    e0.set_reg("IRQ", 1)
    start(e0, short)
    out["short"] = tr.wait(None)
    out["e0_after_short"] = e0.status().name
    # DRAM written right after waking on the interrupt reads back at once and later (a host step's
    # output written then was once lost)
    spot, data = tr.cfg.dram_bytes - 61, bytes(range(1, 11))
    tr.write_dram(spot, data)
    out["written_at_once"] = tr.read_dram(spot, len(data)) == data
    tr.wait(50)
    out["written_later"] = tr.read_dram(spot, len(data)) == data
    # engine 1 starts: the combined interrupt is up already, wait must still wait for engine 1
    e1.set_reg("IRQ", 1)
    start(e1, long)
    out["partial"] = tr.wait(500)
    out["e1_after_partial"] = e1.status().name
    out["long"] = tr.wait(None)
    out["e1_after_long"] = e1.status().name
    out["irq_status"] = tr.read_reg(SOC_REG["IRQ_STATUS"].offset)
    # engine 0 restarted without clearing its interrupt: its line is up while it runs (polled)
    start(e0, long)
    out["stale"] = tr.wait(None)
    out["e0_after_stale"] = e0.status().name
    # engine 1 stops while the host is busy with other registers: the next wait returns at once
    # (the host last saw it running), not after its bound
    e1.set_reg("IRQ", 1)
    start(e1, short)
    t = tr.now()
    while tr.now() - t < 4000:
        tr.read_reg(SOC_REG["SOC_ID"].offset)
    out["stopped_meanwhile"] = tr.read_reg(SOC_REG["IRQ_STATUS"].offset) >> 1 & 1
    out["meanwhile"] = tr.wait(100_000)
    out["e1_after_meanwhile"] = e1.status().name
    # nothing running: max_cycles pass
    out["idle"] = tr.wait(1000)
    for e in (e0, e1):
        e.set_reg("IRQ", 1)
    return out


def soc_jobs(transport, cfg, c, xs):
    """Runs inside the simulation: the jobs, then the checks of `wait`."""
    npu = Npu(transport=transport, config=cfg, dispatch="expected-time")
    return (*submit_all(npu, c, xs), wait_checks(transport))


def test_jobs_on_both_engines_of_the_rtl_soc(operator_model):
    c, xs = operator_model
    cfg = soc_config()
    outs, used, util, cycles, waits = run_on_rtl(soc_jobs, cfg, c, xs, config=cfg, dram_bytes=cfg.dram_bytes)
    # bit-identical to the same jobs on one engine of the golden model
    ref = Npu("model", "tiny").load(c)
    for k, (x, out) in enumerate(zip(xs, outs, strict=True)):
        assert np.array_equal(out, ref.run(x, int8=True)[0]), k
    # both engines ran jobs
    assert {e for u in used for e in u} == {0, 1}, used
    assert all(u > 0 for u in util), util
    # and the SoC's golden model takes about as long for the same submissions
    m_outs, m_used, m_util, m_cycles = submit_all(Npu("model", cfg, dispatch="expected-time"), c, xs)
    assert all(np.array_equal(a, b) for a, b in zip(outs, m_outs, strict=True))
    ratio = cycles / m_cycles
    print(f"RTL SoC {cycles} cycles, SoC model {m_cycles} cycles: ratio {ratio:.3f}; "
          f"engines used rtl {used} model {m_used}; busy rtl {util} model {m_util}")  # fmt: skip
    assert 0.9 <= ratio <= 1.1, (cycles, m_cycles)
    # wait: returns when the engine that was running stops, whatever else is pending
    print(f"wait: {waits}")
    assert waits["e0_after_short"] == "DONE" and 2000 < waits["short"] < 4000, waits
    assert waits["written_at_once"] and waits["written_later"], waits
    assert 500 <= waits["partial"] < 600 and waits["e1_after_partial"] == "RUNNING", waits
    assert waits["e1_after_long"] == "DONE" and waits["partial"] + waits["long"] > 6 * 2000, waits
    assert waits["irq_status"] == 0b11, waits
    assert waits["e0_after_stale"] == "DONE" and waits["stale"] > 6 * 2000, waits
    assert waits["stopped_meanwhile"] and waits["meanwhile"] < 100, waits
    assert waits["e1_after_meanwhile"] == "DONE", waits
    assert 1000 <= waits["idle"] < 1100, waits
