"""Run rounds of concurrent jobs on the SoC's RTL (cocotb) and on the golden model of N engines.

A round gives some engines one `RtlJob` each; they start together and share the DRAM port. Jobs of
one round must use disjoint DRAM (`offset_job` moves a job). The RTL side records, per engine, what
`run_rtl` records for one core plus when the engine started and stopped (cycles since the round
began); the model side (`npu.sim.golden.system.NpuSystem`) produces the same records.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from npu.config import NpuConfig
from npu.container import relocate_program
from npu.sim.rtl.core import RtlJob, RunRecord, sim_dram_bytes, write_job_files

#: one round: engine index -> its job
Round = dict[int, RtlJob]


@dataclass
class EngineRecord:
    run: RunRecord  # DRAM: the round's whole window, after every engine stopped
    start: int  # cycle of the round the engine was started at
    stop: int  # cycle of the round it stopped at for the last time


@dataclass
class RoundRecord:
    engines: dict[int, EngineRecord]
    dram: bytes
    irq_status: int  # the SoC block's IRQ_STATUS once every engine had stopped
    makespan: int = field(init=False)

    def __post_init__(self) -> None:
        self.makespan = max((e.stop for e in self.engines.values()), default=0)


@dataclass
class SocRecord:
    ident: dict[str, int]  # the SoC block's SOC_ID and ENGINES as read by the bench
    rounds: list[RoundRecord]


def offset_job(job: RtlJob, off: int, name: str | None = None) -> RtlJob:
    """The same job placed `off` bytes higher in DRAM (program, data and the compared window)."""
    return dataclasses.replace(
        job,
        name=name or job.name,
        program=relocate_program(job.program, off),
        base=job.base + off,
        dram={a + off: v for a, v in job.dram.items()},
        window=job.window + off,
        bus_fault=None if job.bus_fault is None else (job.bus_fault[0] + off, job.bus_fault[1] + off),
    )


def round_window(rnd: Round) -> int:
    return max(j.extent for j in rnd.values())


def run_soc_rtl(
    cfg: NpuConfig, rounds: list[Round], *, fast_dram: bool = False, stalls: bool = False, waves: bool = False
) -> SocRecord:
    """Run `rounds` on the SoC of `cfg` (`cfg.engines` engines) in one simulation."""
    from npu.hdl.verilog import sim_top_verilog
    from npu.sim.rtl.hdlsim import BUILD, build_and_test

    for rnd in rounds:
        bad = [e for e in rnd if not 0 <= e < cfg.engines]
        if bad:
            raise ValueError(f"engine {bad[0]} does not exist: {cfg.name} has {cfg.engines} engines")
    BUILD.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BUILD, prefix="soc-jobs-") as tmp:
        d = Path(tmp)
        fast_size = sim_dram_bytes(cfg, max(round_window(r) for r in rounds)) if fast_dram else 0
        spec = {"config": dataclasses.asdict(cfg), "fast_dram": fast_size, "stalls": stalls, "rounds": []}
        for k, rnd in enumerate(rounds):
            entries, jobs = [], {}
            for e, job in rnd.items():
                entries += write_job_files(d, job, f"r{k}_e{e}")
                jobs[str(e)] = {
                    "base": job.base,
                    "pause": job.pause,
                    "pause_at": job.pause_at[0] if job.pause_at else None,
                    "max_cycles": job.max_cycles,
                }
            spec["rounds"].append({"window": round_window(rnd), "dram": entries, "jobs": jobs})
        (d / "jobs.json").write_text(json.dumps(spec))
        # AxiRam serves the sim top's bus port (ext_dram): the in-simulator RAM's build, not one more
        verilog, top = sim_top_verilog(cfg, fast_size or sim_dram_bytes(cfg), soc=True), "npu_sim_top"
        name = f"soctop-{cfg.engines}x{cfg.engine.name}"
        build_and_test(
            verilog,
            top,
            "npu.sim.rtl.cocotb_soc",
            name=name,
            extra_env={"NPU_JOBS": str(d)},
            waves=waves,
            quiet=True,
        )
        results = json.loads((d / "results.json").read_text())
        out = []
        for k, r in enumerate(results["rounds"]):
            dram = (d / f"round{k}.dram").read_bytes()
            engines = {}
            for e_str, x in r["engines"].items():
                rec = RunRecord(
                    x["status"],
                    x["error_code"],
                    x["error_pc"],
                    [tuple(p) for p in x["pauses"]],
                    x["counters"],
                    dram,
                    x["run_cycles"],
                )
                engines[int(e_str)] = EngineRecord(rec, x["start"], x["stop"])
            out.append(RoundRecord(engines, dram, r["irq_status"]))
        return SocRecord(results["soc"], out)
