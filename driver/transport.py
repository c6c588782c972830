"""The transport interface every backend implements, and the in-process golden-model backend.

A transport moves register values and DRAM bytes and lets device time pass. Driver code only uses
this interface, so it runs unchanged on the golden model, the RTL simulation and a board behind a
serial bridge. Time is counted in device clock cycles.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from npu.config import NpuConfig
from npu.errors import NpuError
from npu.registers import REG, RESUME_TOKEN_REGS, Status, engine_window

#: `run_on_rtl(fn, *args, config=..., dram_bytes=...)` of the verification harness
#: (npu.sim.rtl.transport): runs `fn(transport, *args)` against the RTL. Benches that also measure the
#: RTL take it as an argument, as the driver does not import the layer above it.
RtlRunner = Callable[..., Any]


class TransportError(NpuError, RuntimeError):
    """The link to the device failed (not an NPU error status)."""


class Transport(ABC):
    cfg: NpuConfig

    @abstractmethod
    def read_reg(self, offset: int) -> int: ...

    @abstractmethod
    def write_reg(self, offset: int, value: int) -> None: ...

    @abstractmethod
    def read_dram(self, addr: int, n: int) -> bytes: ...

    @abstractmethod
    def write_dram(self, addr: int, data: bytes) -> None: ...

    @abstractmethod
    def wait(self, max_cycles: int | None) -> int:
        """Let time pass until the core leaves RUNNING (its interrupt), a FENCE completes (its
        interrupt), the core waits on an empty command ring, or `max_cycles` cycles have passed;
        returns the cycles that passed."""

    @abstractmethod
    def now(self) -> int:
        """Device cycles since the transport was opened."""

    def close(self) -> None:  # noqa: B027 - optional
        pass

    # helpers over the interface
    def reg(self, name: str) -> int:
        return self.read_reg(REG[name].offset)

    def set_reg(self, name: str, value: int) -> None:
        self.write_reg(REG[name].offset, value)

    def status(self) -> Status:
        return Status(self.reg("STATUS"))

    def resume_tokens(self) -> list[int]:
        """RESUME_TOKENS0..2: after a pause, the token counts the resume needs (docs/isa.md)."""
        return [self.reg(name) for name in RESUME_TOKEN_REGS]

    def set_resume_tokens(self, words: list[int]) -> None:
        """The token counts the next START loads ([0, 0, 0]: empty channels, a program's start)."""
        for name, w in zip(RESUME_TOKEN_REGS, words, strict=True):
            self.set_reg(name, w)

    def counter(self, name: str) -> int:
        lo = self.read_reg(REG[name].offset)
        hi = self.read_reg(REG[name].offset + 4)
        return hi << 32 | lo


class ModelTransport(Transport):
    """The golden model, in process (bit-exact; cycle-approximate timing)."""

    def __init__(self, cfg: NpuConfig, *, trace: bool = False):
        from npu.sim.golden.model import NpuModel

        self.cfg = cfg
        self.model = NpuModel(cfg, trace=trace)

    def read_reg(self, offset: int) -> int:
        return self.model.read_reg(offset)

    def write_reg(self, offset: int, value: int) -> None:
        self.model.write_reg(offset, value)

    def read_dram(self, addr: int, n: int) -> bytes:
        return self.model.read_dram(addr, n)

    def write_dram(self, addr: int, data: bytes) -> None:
        self.model.write_dram(addr, data)

    def wait(self, max_cycles: int | None) -> int:
        t0 = self.model.now
        if self.model.status == Status.RUNNING:
            self.model.run(max_cycles, until_fence=True)
        elif max_cycles:
            self.model.advance(max_cycles)
        return self.model.now - t0

    def now(self) -> int:
        return self.model.now


class EngineView(Transport):
    """One engine of a SoC: its register window; DRAM, time and waiting are the SoC's."""

    def __init__(self, soc: Transport, index: int):
        self.soc, self.index, self.base = soc, index, engine_window(index)
        self.cfg = soc.cfg.engine

    def read_reg(self, offset: int) -> int:
        return self.soc.read_reg(self.base + offset)

    def write_reg(self, offset: int, value: int) -> None:
        self.soc.write_reg(self.base + offset, value)

    def read_dram(self, addr: int, n: int) -> bytes:
        return self.soc.read_dram(addr, n)

    def write_dram(self, addr: int, data: bytes) -> None:
        self.soc.write_dram(addr, data)

    def wait(self, max_cycles: int | None) -> int:
        return self.soc.wait(max_cycles)

    def now(self) -> int:
        return self.soc.now()


class SocModelTransport(ModelTransport):
    """The golden model of a SoC (`npu.sim.golden.system.NpuSystem`): engines sharing DRAM and its port,
    registers at SoC offsets (the SoC block, then one window per engine)."""

    def __init__(self, cfg: NpuConfig, *, trace: bool = False):
        from npu.sim.golden.system import NpuSystem

        self.cfg = cfg
        self.model = NpuSystem(cfg, trace=trace)

    def wait(self, max_cycles: int | None) -> int:
        """Until an engine that is running stops (the combined interrupt), or `max_cycles`."""
        t0 = self.model.now
        if any(e.status == Status.RUNNING for e in self.model.engines):
            self.model.run_until_stop(max_cycles)
        elif max_cycles:
            self.model.advance(max_cycles)
        return self.model.now - t0
