"""The micro core's control processor: PicoRV32 (YosysHQ, ISC licence; Verilog from the PyPI package
`pythondata-cpu-picorv32`), instantiated with its native memory interface.

Configured small for the iCE40 UP5K: RV32I with multiply (no divide; `PcpiMul`, shift-and-add in
logic cells), no compressed instructions (their decoder took 409 LUT4; the firmware runs from SPRAM,
where its 30 % more bytes cost no block RAM: docs/micro.md), no counters, no interrupts, no traps;
the register file reads from registered addresses, so it maps to block RAM.
"""

from __future__ import annotations

from pathlib import Path

from amaranth import ClockSignal, Instance, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .mul import PcpiMul

#: PicoRV32's parameters (the firmware is compiled to match: hdl/micro/firmware)
PARAMETERS = {
    "ENABLE_COUNTERS": 0,
    "ENABLE_COUNTERS64": 0,
    "ENABLE_REGS_DUALPORT": 1,  # two read ports from registered addresses: block RAM, not flip-flops
    "TWO_STAGE_SHIFT": 1,
    "COMPRESSED_ISA": 0,
    "CATCH_MISALIGN": 0,
    "CATCH_ILLINSN": 0,
    "ENABLE_PCPI": 1,  # multiplies in PcpiMul (hdl/micro/mul.py)
    "ENABLE_IRQ": 0,
}
MODULE = "picorv32"
ISA = "rv32i_zmmul"  # multiply without divide (PcpiMul)


def picorv32_source() -> str:
    """PicoRV32's Verilog (the `picorv32` module and its PCPI multiplier)."""
    try:
        import pythondata_cpu_picorv32 as pkg
    except ImportError:
        raise RuntimeError(
            "the micro core needs PicoRV32's Verilog: `pip install pythondata-cpu-picorv32` "
            "(installed by the README's set-up)"
        ) from None
    return (Path(pkg.data_location) / "picorv32.v").read_text()


class MemBus(wiring.Signature):
    """PicoRV32's native memory interface, seen from the CPU: `valid` holds until `ready`;
    `wstrb` non-zero is a write."""

    def __init__(self):
        super().__init__(
            {
                "valid": Out(1),
                "instr": Out(1),
                "addr": Out(32),
                "wdata": Out(32),
                "wstrb": Out(4),
                "ready": In(1),
                "rdata": In(32),
                # look-ahead: a read of la_addr starts next cycle (memories prime their read now)
                "la_read": Out(1),
                "la_addr": Out(32),
            }
        )


class PicoRV32(wiring.Component):
    """The CPU (reset: the `sync` domain's reset, or `stop`); `trap` rises on an illegal instruction
    (a firmware fault)."""

    def __init__(self, *, stack_top: int):
        self.stack_top = stack_top
        super().__init__({"mem": Out(MemBus()), "stop": In(1), "trap": Out(1)})

    def elaborate(self, platform):
        m = Module()
        if platform is not None and hasattr(platform, "add_file"):
            platform.add_file("picorv32.v", picorv32_source())
        resetn = Signal()
        m.d.comb += resetn.eq(~(ResetSignal("sync") | self.stop))
        params = {f"p_{k}": v for k, v in PARAMETERS.items()}
        m.submodules.mul = mul = PcpiMul()
        m.submodules.cpu = Instance(
            MODULE,
            **params,
            p_PROGADDR_RESET=0,
            p_STACKADDR=self.stack_top,
            i_clk=ClockSignal("sync"),
            i_resetn=resetn,
            o_trap=self.trap,
            o_mem_valid=self.mem.valid,
            o_mem_instr=self.mem.instr,
            i_mem_ready=self.mem.ready,
            o_mem_addr=self.mem.addr,
            o_mem_wdata=self.mem.wdata,
            o_mem_wstrb=self.mem.wstrb,
            i_mem_rdata=self.mem.rdata,
            o_mem_la_read=self.mem.la_read,
            o_mem_la_addr=self.mem.la_addr,
            o_pcpi_valid=mul.pcpi.valid,
            o_pcpi_insn=mul.pcpi.insn,
            o_pcpi_rs1=mul.pcpi.rs1,
            o_pcpi_rs2=mul.pcpi.rs2,
            i_pcpi_wr=mul.pcpi.wr,
            i_pcpi_rd=mul.pcpi.rd,
            i_pcpi_wait=mul.pcpi.wait,
            i_pcpi_ready=mul.pcpi.ready,
            i_irq=0,
        )
        return m
