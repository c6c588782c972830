"""Run an assembled program (with its `.data`/`.output` directives) on the golden model."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npu.asm import DTYPES, Assembly, DataInit
from npu.config import NpuConfig, get_config
from npu.errors import NpuError
from npu.isa import INSTR_BYTES
from npu.manifest_check import check_container
from npu.registers import Status
from npu.sim.golden.model import NpuModel


class RunError(NpuError, RuntimeError):
    pass


@dataclass
class RunResult:
    status: Status
    error_code: int
    error_pc: int
    counters: dict[str, int]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    wall_s: float = 0.0
    pauses: list[tuple[int, int]] = field(default_factory=list)  # (cp id, resume pc) per pause


def data_array(d: DataInit, source_dir: Path) -> np.ndarray:
    if d.kind == "file":
        p = (source_dir / d.path) if not Path(d.path).is_absolute() else Path(d.path)
        try:
            return np.load(p)
        except (OSError, ValueError) as e:
            raise RunError(f"line {d.line}: cannot load {p}: {e}") from None
    dt = np.dtype(DTYPES[d.dtype])
    info = np.iinfo(dt)
    rng = np.random.default_rng(d.seed)
    return rng.integers(info.min, info.max, size=d.shape, dtype=dt, endpoint=True)


def prepare(model: NpuModel, asm: Assembly, base: int) -> None:
    """Write the program at `base` and every `.data` block into the model's DRAM."""
    prog = asm.binary()
    regions = [(base, base + len(prog), "program")]
    src_dir = Path(asm.source).parent if asm.source and not asm.source.startswith("<") else Path(".")
    if base % 32:
        raise RunError(f"{asm.source}: the program base 0x{base:x} is not 32-byte aligned (PROGRAM_BASE)")
    if base + len(prog) > model.cfg.dram_bytes:
        raise RunError(
            f"{asm.source}: the program (0x{base:x}+{len(prog)}) does not fit in DRAM "
            f"(0x{model.cfg.dram_bytes:x} bytes on {model.cfg.name})"
        )
    for d in asm.data:
        # the size is checked before a random block is built (a typo in a shape must not allocate GBs)
        arr = np.ascontiguousarray(data_array(d, src_dir)) if d.kind == "file" else None
        nbytes = arr.nbytes if arr is not None else math.prod(d.shape) * np.dtype(DTYPES[d.dtype]).itemsize
        regions.append((d.addr, d.addr + nbytes, f".data at line {d.line}"))
        if d.addr + nbytes > model.cfg.dram_bytes:
            raise RunError(
                f"{asm.source}:{d.line}: .data 0x{d.addr:x}+{nbytes} exceeds DRAM "
                f"(0x{model.cfg.dram_bytes:x} bytes on {model.cfg.name})"
            )
        model.write_dram(d.addr, arr if arr is not None else data_array(d, src_dir))
    regions.sort()
    for (a0, a1, n0), (b0, b1, n1) in zip(regions, regions[1:], strict=False):
        if b0 < a1:
            raise RunError(f"{asm.source}: {n0} (0x{a0:x}..0x{a1:x}) overlaps {n1} (0x{b0:x}..0x{b1:x})")
    model.load_program(prog, base)


def read_outputs(model: NpuModel, asm: Assembly) -> dict[str, np.ndarray]:
    out = {}
    for o in asm.outputs:
        dt = np.dtype(DTYPES[o.dtype])
        n = int(np.prod(o.shape)) * dt.itemsize
        out[o.name] = np.frombuffer(model.read_dram(o.addr, n), dt).reshape(o.shape).copy()
    return out


def run_assembly(
    asm: Assembly,
    cfg: NpuConfig,
    *,
    base: int = 0,
    pause_at: list[int] | None = None,
    max_cycles: int | None = None,
    model: NpuModel | None = None,
) -> RunResult:
    """Run to completion; `pause_at` raises a pause at each listed cycle offset and resumes."""
    model = model or NpuModel(cfg)
    prepare(model, asm, base)
    t0 = time.perf_counter()
    pauses = []
    cycles = 0
    counters_total: dict[str, int] = {}
    model.start(pc=0)
    start_cycle = model.now
    for at in sorted(pause_at or []):
        st = model.advance(max(0, start_cycle + at - model.now))
        if st != Status.RUNNING:
            break
        model.request_pause()
        st = model.run(max_cycles)
        if st == Status.PAUSED:
            pauses.append((model.cp_id, model.resume_pc))
            for k, v in model.counter_values().items():
                counters_total[k] = counters_total.get(k, 0) + v
            model.start(pc=model.resume_pc)
        elif st != Status.DONE:
            break
    st = model.run(max_cycles)
    for k, v in model.counter_values().items():
        counters_total[k] = counters_total.get(k, 0) + v
    cycles = counters_total.get("CYCLES", 0)
    wall = time.perf_counter() - t0
    res = RunResult(st, int(model.error_code), model.error_pc, counters_total, wall_s=wall, pauses=pauses)
    res.counters["CYCLES"] = cycles
    if st == Status.DONE:
        res.outputs = read_outputs(model, asm)
    return res


def timing_run(
    cfg: NpuConfig, instrs, base: int = 0, model: NpuModel | None = None, trace: bool = False
) -> NpuModel:
    """Run a program on the golden model for its timing only (data are not computed): the cost
    model of the compiler. Returns the model after DONE (its counters, and its trace with `trace`).
    A program longer than the DRAM is timed as if the DRAM held it: the compiler times programs
    before it places them, and refuses one that does not fit with the sizes it needs (DramTooSmall)."""
    instrs = list(instrs)
    end = base + len(instrs) * INSTR_BYTES
    cfg = get_config(cfg)
    if model is None and end > cfg.dram_bytes:
        cfg = dataclasses.replace(cfg, dram_bytes=1 << (end - 1).bit_length())
    m = model or NpuModel(cfg, trace=trace, timing_only=True)
    m.soft_reset()
    if m.timing_only:
        m.load_instructions(instrs, base)
    else:
        from npu.isa import encode_program

        m.load_program(encode_program(instrs), base)
    m.start(pc=0)
    st = m.run()
    if st != Status.DONE:
        raise RunError(f"timing run ended in {st.name} ({m.error_code.name} at pc {m.error_pc})")
    return m


#: the trace's unit names (its other events: the dispatcher's, the core's)
UNIT_EVENTS = frozenset(("load", "matrix", "vector", "store"))


def first_starts_after(trace, points: list[int]) -> dict[int, int]:
    """For each cancellation point (its pc, `points` ascending) of a traced run, the cycle the first
    thing after it starts in any unit (an instruction, a SYNC, a fence's marker): a pause asked
    before then stops at that point or an earlier one, from then on at a later one (docs/isa.md,
    "Pause latency bound"). A point nothing starts after is missing."""
    from bisect import bisect_left

    after: dict[int, int] = {}  # index of the last point before a start -> the earliest such start
    for e in trace:
        if e.unit in UNIT_EVENTS and e.op != "pass_point":
            k = bisect_left(points, e.pc) - 1
            if k >= 0 and e.start < after.get(k, e.start + 1):
                after[k] = e.start
    out: dict[int, int] = {}  # the earliest start after each point: after it, or after a later one
    soonest = None
    for k in range(len(points) - 1, -1, -1):
        if k in after and (soonest is None or after[k] < soonest):
            soonest = after[k]
        if soonest is not None:
            out[points[k]] = soonest
    return out


def point_passes(trace) -> dict[int, tuple[int, int]]:
    """For each cancellation point (its pc) of a traced run: the cycle the first unit starts to
    pass it and the cycle the last unit has passed it (docs/isa.md, "Pause latency bound": their
    difference is the point's drain)."""
    out: dict[int, tuple[int, int]] = {}
    for e in trace:
        if e.op == "pass_point":
            first, last = out.get(e.pc, (e.start, e.end))
            out[e.pc] = (min(first, e.start), max(last, e.end))
    return out


class ModelDevice:
    """The golden model as an executor device (npu.executor.Device)."""

    def __init__(self, model: NpuModel, max_cycles: int | None = None):
        self.model = model
        self.max_cycles = max_cycles
        self.counters: dict[str, int] = {}

    def write_dram(self, addr: int, data: bytes) -> None:
        self.model.write_dram(addr, data)

    def read_dram(self, addr: int, n: int) -> bytes:
        return self.model.read_dram(addr, n)

    def run_segment(self, pc: int) -> None:
        m = self.model
        m.start(pc=pc)
        st = m.run(self.max_cycles)
        for k, v in m.counter_values().items():
            self.counters[k] = self.counters.get(k, 0) + v
        if st != Status.DONE:
            raise RunError(f"the NPU stopped with {st.name}: {m.error_code.name} at pc {m.error_pc}")


class InOrderDevice(ModelDevice):
    """The golden model's values without its timing: each segment's instructions decoded, checked
    (`validate`, as the hardware's dispatch checks them) and executed by the same kernels one after
    another in program order, the control instructions (SYNC, BARRIER, FENCE, cancellation points)
    passed. A program whose tokens order every pair of instructions that touch the same bytes - the
    compiler's programs (`npu.program.ProgramBuilder`) - computes the same values in any order its
    tokens allow, so this gives the timed model's results in about half its time; no cycles are
    counted (`counters` stays empty)."""

    def run_segment(self, pc: int) -> None:
        from npu.isa import INSTR_BYTES, IsaError, Opcode
        from npu.sim.golden.kernels import execute

        m = self.model
        passed = (Opcode.SYNC, Opcode.BARRIER, Opcode.FENCE, Opcode.CANCEL_POINT)
        while True:
            addr = m.program_base + pc * INSTR_BYTES
            if addr < 0 or addr + INSTR_BYTES > len(m.dram):
                raise RunError(f"the program ran off DRAM at pc {pc} without an END")
            ins = m.decoded(m.dram[addr : addr + INSTR_BYTES].tobytes())
            if isinstance(ins, IsaError):
                raise RunError(f"the NPU stopped with ERROR: {ins.code.name} at pc {pc}: {ins}")
            if ins.op == Opcode.END:
                return
            if ins.op not in passed:
                execute(m.chip, m.dram, ins)
            pc += 1


def run_container(
    container,
    inputs: list[np.ndarray],
    cfg: NpuConfig,
    model: NpuModel | None = None,
    max_cycles: int | None = None,
    int8: bool = False,
    in_order: bool = False,
) -> tuple[list[np.ndarray], dict[str, int]]:
    """Run a compiled `.npub` on the golden model: quantise the float inputs, run the NPU and host
    segments, dequantise (or, with `int8`, return the raw int8 outputs). `in_order`: the values
    only, without the timing (`InOrderDevice`: no counters)."""
    from npu.executor import HostStepError, HostSteps, run_segments

    if container.config_id != cfg.config_id:
        raise RunError(
            f"the program was compiled for configuration id 0x{container.config_id:08x} "
            f"({container.manifest.config}), not for {cfg.name} (0x{cfg.config_id:08x})"
        )
    check_container(container, cfg)
    man = container.manifest
    m = model or NpuModel(cfg)
    for d in man.dram:
        m.write_dram(d.addr, container.blobs[d.blob])
    m.load_program(container.blobs["program"], man.program.base)
    dev = InOrderDevice(m) if in_order else ModelDevice(m, max_cycles)
    try:
        outs = run_segments(man, HostSteps(container.blobs, man.segments), dev, inputs, int8=int8)
    except (ValueError, HostStepError) as e:
        raise RunError(str(e)) from None
    return outs, dev.counters
