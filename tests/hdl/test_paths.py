"""Verilog generation, the in-simulator DRAM path and the Icarus simulator."""

import shutil

import numpy as np
import pytest

from npu.cli import main
from npu.config import get_config
from npu.isa import ErrorCode
from npu.sim.rtl.core import compare, run_model, run_rtl
from npu.sim.rtl.gemm_bench import gemm_job
from npu.sim.rtl.suite import bus_fault_jobs, directed_jobs, random_jobs

#: each preset's RTL runs in the simulation suites (inside the sim top); converting the larger
#: presets' own tops again takes 20-30 s each on a fresh clone: `make test-all` (slow)
_SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "name", ["tiny", pytest.param("default", marks=_SLOW), pytest.param("banked", marks=_SLOW)]
)
def test_npu_hdl_verilog(name, tmp_path, capsys):
    out = tmp_path / "npu.v"
    assert main(["hdl", "verilog", "--config", name, "-o", str(out)]) == 0
    text = out.read_text()
    assert "module npu_core(" in text
    for port in ("m_axi_araddr", "m_axi_wstrb", "s_axil_awaddr", "irq"):
        assert port in text
    assert name in capsys.readouterr().out


@pytest.mark.rtl
def test_fast_dram_path_matches_model():
    """The in-simulator RAM used for long runs gives the same results as the model, also when it
    stalls every AXI channel at random (its stall_en port: one build, both runs); the stalls cost
    cycles."""
    cfg = get_config("tiny")
    gemm, ref, c_addr, _ = gemm_job(cfg, 24)
    jobs = [
        gemm,
        *random_jobs(cfg, range(300, 320)),
        *random_jobs(cfg, range(320, 325), pause="every", cp_prob=0.3),
    ]
    cycles = {}
    for stalls in (False, True):
        recs = run_rtl(cfg, jobs, fast_dram=True, stalls=stalls)
        for job, rec in zip(jobs, recs, strict=True):
            assert not compare(run_model(cfg, job), rec), (stalls, job.name)
        got = np.frombuffer(recs[0].dram[c_addr : c_addr + ref.size], np.int8).reshape(ref.shape)
        assert np.array_equal(got, ref)
        cycles[stalls] = sum(r.counters["CYCLES"] for r in recs)
    assert cycles[True] > cycles[False], cycles  # without stall_en taking effect they would be equal


@pytest.mark.rtl
@pytest.mark.parametrize("fast", [True, False], ids=["in-simulator-ram", "axiram"])
def test_bus_errors_end_the_run_on_every_channel(fast):
    """SLVERR on a LOAD's read, a STORE's write response and an instruction fetch end the run in BUS
    at that instruction, as the model predicts; a prefetch past END into the range does not."""
    cfg = get_config("tiny")
    jobs = bus_fault_jobs(cfg)
    bus = ErrorCode.BUS
    expected = {"bus_load": (bus, 1), "bus_store": (bus, 1), "bus_fetch": (bus, 2), "bus_prefetch": (0, 0)}
    for job, rec in zip(jobs, run_rtl(cfg, jobs, fast_dram=fast), strict=True):
        model = run_model(cfg, job)
        assert not compare(model, rec), (job.name, compare(model, rec))
        code, pc = expected[job.name]
        assert (rec.error_code, rec.status) == (code, "ERROR" if code else "DONE"), job.name
        assert rec.error_pc == pc, job.name


@pytest.mark.rtl
@pytest.mark.skipif(
    shutil.which("iverilog") is None, reason="Icarus Verilog is not installed (CI installs it)"
)
def test_icarus(monkeypatch):
    monkeypatch.setenv("SIM", "icarus")
    cfg = get_config("tiny")
    jobs = [j for j in directed_jobs(cfg) if j.name in ("load_padded_misaligned", "mm_ragged", "vadd_edges")]
    for job, rec in zip(jobs, run_rtl(cfg, jobs), strict=True):
        assert not compare(run_model(cfg, job), rec), job.name


@pytest.mark.parametrize(
    "args",
    [
        ["--config", "tiny", "--engines", "2"],
        pytest.param(["--config", "duo"], marks=_SLOW),
        pytest.param(["--config", "tiny", "--engines", "4"], marks=_SLOW),
    ],
)
def test_npu_hdl_verilog_soc(args, tmp_path, capsys):
    out = tmp_path / "soc.v"
    assert main(["hdl", "verilog", *args, "-o", str(out)]) == 0
    text = out.read_text()
    assert "module npu_soc(" in text
    for port in ("m_axi_arid", "m_axi_bid", "s_axil_awaddr", "irqs", "irq"):
        assert port in text
    assert "NpuSoc" in capsys.readouterr().out
