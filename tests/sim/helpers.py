"""Shared helpers for golden-model tests: build, run and read back small programs."""

from __future__ import annotations

import numpy as np

from npu.config import NpuConfig
from npu.isa import Instr, encode_program
from npu.program import ProgramBuilder
from npu.registers import Status
from npu.sim.golden.model import NpuModel

PROG_BASE = 0x0
DATA_BASE = 0x4000


def run_instrs(
    cfg: NpuConfig,
    instrs: list[Instr],
    dram: dict[int, np.ndarray] | None = None,
    *,
    build: bool = True,
    model: NpuModel | None = None,
    max_cycles: int | None = 10_000_000,
) -> NpuModel:
    """Run unit instructions (tokens assigned by the builder unless build=False) and return the model."""
    if build:
        b = ProgramBuilder(cfg)
        for i in instrs:
            b.add(i)
        instrs = b.build().instrs
    m = model or NpuModel(cfg)
    for addr, arr in (dram or {}).items():
        m.write_dram(addr, np.ascontiguousarray(arr))
    m.load_program(encode_program(instrs), PROG_BASE)
    m.start()
    m.run(max_cycles)
    return m


def read(m: NpuModel, addr: int, shape, dtype=np.int8) -> np.ndarray:
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) * dt.itemsize
    return np.frombuffer(m.read_dram(addr, n), dt).reshape(shape).copy()


def assert_done(m: NpuModel) -> None:
    assert m.status == Status.DONE, f"status {m.status.name}, error {m.error_code.name} at pc {m.error_pc}"
