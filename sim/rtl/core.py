"""Run programs on the RTL (cocotb + Verilator/Icarus) and on the golden model, and compare.

`RtlJob` describes one program run; `run_rtl` executes a batch of jobs in one simulation (the
Verilog is built once per configuration and cached); `run_model` executes the same job on the golden
model, producing the same record so the two can be compared field by field.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npu.config import PRESETS, NpuConfig
from npu.registers import COUNTERS, Status
from npu.sim.golden.model import NpuModel


@dataclass
class RtlJob:
    name: str
    program: bytes
    base: int
    dram: dict[int, bytes] = field(default_factory=dict)
    window: int = 0x10000  # DRAM bytes [0, window) compared after the run
    pause: str = "none"  # "none" | "every" (pause at every cancellation point)
    pause_at: list[int] = field(default_factory=list)
    timeout: int = 0
    max_cycles: int = 5_000_000
    bus_fault: tuple[int, int] | None = None  # DRAM [lo, hi) answers bus beats with SLVERR
    dram_window: tuple[int, int] = (0, 0)  # DRAM_BASE, DRAM_LIMIT (0, 0: no memory window)

    def memory(self) -> dict[int, bytes]:
        """Everything the job puts in DRAM before it starts: its data and its program."""
        return {**self.dram, self.base: self.program}

    @property
    def extent(self) -> int:
        """DRAM bytes [0, extent) the job touches or compares."""
        return max(self.window, self.base + len(self.program))


def write_job_files(d: Path, job: RtlJob, prefix: str) -> list[list]:
    """Write the job's DRAM blocks for a bench into folder `d`: [[address, file name], ...]."""
    entries = []
    for n, (addr, data) in enumerate(job.memory().items()):
        name = f"{prefix}_{n}.bin"
        (d / name).write_bytes(data)
        entries.append([addr, name])
    return entries


def sim_dram_bytes(cfg: NpuConfig, extent: int = 0) -> int:
    """Size of the in-simulator RAM for jobs within [0, extent) on `cfg`: the configuration's DRAM
    (a power of two at least), whatever the jobs, so every run of a preset (each suite, the driver's
    transport, with or without stalls) shares one simulator build. The array costs its memory only;
    the bench writes and reads back just the jobs' bytes."""
    return 1 << (max(extent, cfg.dram_bytes) - 1).bit_length()


@dataclass
class RunRecord:
    status: str
    error_code: int
    error_pc: int
    pauses: list[tuple[int, ...]]  # (CP_ID, RESUME_PC, RESUME_TOKENS0..2) of each pause
    counters: dict[str, int]
    dram: bytes
    run_cycles: list[int] = field(default_factory=list)  # CYCLES of each START..stop
    wall_s: float = 0.0  # wall time of the job in the simulator (with DRAM set-up and read-back)
    run_wall_s: float = 0.0  # wall time from START to stop, summed over the job's runs
    # for a `pause_at` request the hardware took: points passed by the most advanced unit when it
    # latched the request, and the point ordinal it chose as target (None: no request was taken)
    pause_passed: int | None = None
    pause_target: int | None = None
    fault_addr: int = 0  # FAULT_ADDR after the run (PROTECTION)
    pc_cycles: dict[int, int] | None = None  # the micro core's cycles at each firmware PC (`profile`)


def prepared_model(cfg: NpuConfig, job: RtlJob, trace: bool = False) -> NpuModel:
    """A golden model holding the job's DRAM contents and program, ready to START."""
    m = NpuModel(cfg, trace=trace)
    for addr, data in job.dram.items():
        m.write_dram(addr, data)
    m.load_program(job.program, job.base)
    m.timeout = job.timeout
    m.bus_fault = job.bus_fault
    m.dram_base, m.dram_limit = job.dram_window
    return m


def run_model(cfg: NpuConfig, job: RtlJob, pause_target: int | None = None) -> RunRecord:
    """Run `job` on the golden model. A `pause_at` request is raised at that cycle, or, with
    `pause_target`, at the moment the progress of the units makes that point the target (the
    point the hardware chose when it took the request, see `RunRecord.pause_target`)."""
    m = prepared_model(cfg, job)
    pauses = []
    total = dict.fromkeys(COUNTERS, 0)
    pc = 0
    pause_at = sorted(job.pause_at)
    first = True
    while True:
        m.start(pc=pc, pause=job.pause == "every")
        if first and pause_target is not None:
            m.advance_until_target(pause_target)
            if m.status == Status.RUNNING:
                m.request_pause()
        elif first and pause_at:
            m.advance(pause_at[0])
            if m.status == Status.RUNNING:
                m.request_pause()
        first = False
        st = m.run(job.max_cycles)
        for k, v in m.counter_values().items():
            total[k] += v
        if st == Status.PAUSED:
            pauses.append((m.cp_id, m.resume_pc, *m.resume_tokens))
            pc = m.resume_pc
            continue
        break
    rec = RunRecord(st.name, int(m.error_code), m.error_pc, pauses, total, m.read_dram(0, job.window))
    rec.fault_addr = m.fault_addr
    return rec


def run_rtl(
    cfg: NpuConfig,
    jobs: list[RtlJob],
    *,
    waves: bool = False,
    fast_dram: bool = False,
    stalls: bool = False,
    flash_boot: bool | bytes = False,
    profile: bool = False,
) -> list[RunRecord]:
    """Run jobs on the RTL. `fast_dram` swaps cocotbext-axi's AxiRam (protocol-checking, slower)
    for the in-simulator RAM of hdl/simdram.py (for long runs). `stalls`: the DRAM side stalls every
    AXI channel at random (cocotbext-axi pause generators on AxiRam, an LFSR in the in-simulator
    RAM), so results must not depend on timing; cycle counts then differ from the model's.
    `flash_boot`: a micro core boots from a model of the SPI flash (its boot loader copies the
    firmware) instead of starting with it preloaded; bytes: the flash holds these at FLASH_FIRMWARE
    instead of the firmware's image. `profile` (a micro core): each record gets the cycles its runs
    spent at each firmware PC (`npu.sim.rtl.fwprof`)."""
    from npu.hdl.verilog import sim_top_verilog
    from npu.sim.rtl.hdlsim import BUILD, PROFILE_ENV, build_and_test

    if profile and cfg.core != "micro":
        raise ValueError(f"profiling samples the micro core's firmware; {cfg.name!r} has no processor")

    BUILD.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BUILD, prefix="jobs-") as tmp:
        d = Path(tmp)
        fast_size = sim_dram_bytes(cfg, max(j.extent for j in jobs)) if fast_dram else 0
        preset = PRESETS.get(cfg.name) == cfg  # else a test's own configuration, every field
        spec = {"config": cfg.name if preset else dataclasses.asdict(cfg), "jobs": [], "fast_dram": fast_size,
                "stalls": stalls}  # fmt: skip
        for j, job in enumerate(jobs):
            entries = write_job_files(d, job, f"j{j}")
            spec["jobs"].append(
                {
                    "name": f"job{j}",
                    "base": job.base,
                    "window": job.window,
                    "dram": entries,
                    "pause": job.pause,
                    "pause_at": job.pause_at,
                    "timeout": job.timeout,
                    "max_cycles": job.max_cycles,
                    "bus_fault": job.bus_fault,
                    "dram_window": job.dram_window,
                }
            )
        (d / "jobs.json").write_text(json.dumps(spec))
        # AxiRam serves the sim top's bus port (ext_dram): the in-simulator RAM's build, not one more
        verilog = sim_top_verilog(cfg, fast_size or sim_dram_bytes(cfg), flash_boot=flash_boot)
        top, name = "npu_sim_top", f"simtop-{cfg.name}"
        # build and simulator output go to build.log / sim.log, so `--json` output stays clean
        build_and_test(
            verilog,
            top,
            "npu.sim.rtl.cocotb_bench",
            name=name,
            extra_env={"NPU_JOBS": str(d), **({PROFILE_ENV: "1"} if profile else {})},
            waves=waves,
            quiet=True,
        )
        results = json.loads((d / "results.json").read_text())
        out = []
        for j, r in enumerate(results):
            out.append(
                RunRecord(
                    r["status"],
                    r["error_code"],
                    r["error_pc"],
                    [tuple(p) for p in r["pauses"]],
                    r["counters"],
                    (d / f"job{j}.dram").read_bytes(),
                    r["run_cycles"],
                    r["wall_s"],
                    r["run_wall_s"],
                    r.get("pause_passed"),
                    r.get("pause_target"),
                    r.get("fault_addr", 0),
                    {int(k): v for k, v in r["pc_cycles"].items()} if "pc_cycles" in r else None,
                )
            )
        return out


def compare(model: RunRecord, rtl: RunRecord) -> list[str]:
    """Differences between a model run and an RTL run (empty when they agree)."""
    diffs = []
    for f in ("status", "error_code", "pauses", "fault_addr"):
        if getattr(model, f) != getattr(rtl, f):
            diffs.append(f"{f}: model {getattr(model, f)!r}, rtl {getattr(rtl, f)!r}")
    # the pc of a TIMEOUT depends on timing, every other error names a definite instruction
    if model.error_code and model.error_code != 8 and model.error_pc != rtl.error_pc:
        diffs.append(f"error_pc: model {model.error_pc}, rtl {rtl.error_pc}")
    if model.dram != rtl.dram:
        a = np.frombuffer(model.dram, np.uint8)
        b = np.frombuffer(rtl.dram, np.uint8)
        bad = np.nonzero(a != b)[0]
        diffs.append(
            f"DRAM differs at {len(bad)} bytes, first at 0x{bad[0]:x} (model {a[bad[0]]}, rtl {b[bad[0]]})"
        )
    for k in ("DMA_RD_BYTES", "DMA_WR_BYTES"):
        if model.status == "DONE" and model.counters[k] != rtl.counters[k]:
            diffs.append(f"{k}: model {model.counters[k]}, rtl {rtl.counters[k]}")
    return diffs
