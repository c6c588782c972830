"""AXI4-Lite slave exposing the shared register map (npu/registers.py).

In: AXI4-Lite transactions from the host and the core's status. Out: control pulses and levels.
Writes and reads complete in one beat each; unmapped reads return 0, writes to read-only or unmapped
registers are ignored. Reading a 64-bit counter's LO half latches its HI half.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig
from npu.registers import ISA_VERSION, NPU_MAGIC, REG, REGISTERS, Status

from .axi import AxiLiteSignature

ADDR_BITS = 8


class RegisterFile(wiring.Component):
    def __init__(self, cfg: NpuConfig):
        self.cfg = cfg
        sig = {"bus": In(AxiLiteSignature(addr_width=ADDR_BITS))}
        sig.update(
            {
                # to the core
                "start": Out(1),  # one-cycle pulse
                "soft_reset": Out(1),  # one-cycle pulse
                "pause_req": Out(1),  # level
                "irq_enable": Out(1),
                "program_base": Out(32),
                "resume_pc": Out(32),
                "resume_tokens": Out(96),  # RESUME_TOKENS0..2: the channels' counts a START loads
                "timeout": Out(32),
                "timeout_next": Out(32),  # TIMEOUT from the next cycle on
                "ring_base": Out(32),
                "ring_size": Out(32),
                "ring_tail": Out(32),
                "dram_base": Out(32),  # the memory window (0, 0: none)
                "dram_limit": Out(32),
                # from the core
                "status": In(6),  # the run state (RUNNING while running from an empty ring)
                "waiting": In(1),  # running from an empty ring with everything done: reads WAITING
                "ring_head": In(32),
                "fence_event": In(1),  # a FENCE completed this cycle: count it, raise IRQ
                "set_resume_pc": In(1),
                "new_resume_pc": In(32),
                "new_resume_tokens": In(96),  # taken with new_resume_pc (a pause: the channels' counts)
                "consume_pause": In(1),
                "stop_event": In(1),  # the core left RUNNING this cycle: raise IRQ
                "cp_id": In(32),
                "error_code": In(8),
                "error_pc": In(32),
                "fault_addr": In(32),
                "irq_pending": Out(1),
                **{f"cnt_{r.name.lower()}": In(64) for r in REGISTERS if r.wide},
            }
        )
        super().__init__(sig)

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        # ---- write channel: accept address and data together ------------------------------------
        aw_ok = bus.awvalid & bus.wvalid & ~bus.bvalid
        m.d.comb += [bus.awready.eq(aw_ok), bus.wready.eq(aw_ok)]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)
        wr = Signal()
        m.d.comb += wr.eq(aw_ok)
        with m.If(aw_ok):
            m.d.sync += bus.bvalid.eq(1)
        waddr = bus.awaddr
        wdata = bus.wdata

        m.d.sync += [self.start.eq(0), self.soft_reset.eq(0)]
        m.d.comb += self.timeout_next.eq(self.timeout)
        m.d.sync += self.timeout.eq(self.timeout_next)
        with m.If(self.consume_pause):
            m.d.sync += self.pause_req.eq(0)
        with m.If(self.start):  # the START that loads them into the channels clears them
            m.d.sync += self.resume_tokens.eq(0)
        with m.If(self.set_resume_pc):
            m.d.sync += self.resume_pc.eq(self.new_resume_pc)
        # the channels' counts a cycle later (nothing moves in a stopped core): the stop's logic
        # does not drive the 96 enables (Fmax)
        save_tokens = Signal()
        m.d.sync += save_tokens.eq(self.set_resume_pc)
        with m.If(save_tokens):
            m.d.sync += self.resume_tokens.eq(self.new_resume_tokens)
        fence_count = Signal(32)
        with m.If(self.stop_event | self.fence_event):
            m.d.sync += self.irq_pending.eq(1)
        with m.If(self.fence_event):
            m.d.sync += fence_count.eq(fence_count + 1)
        with m.If(wr):
            with m.Switch(waddr):
                with m.Case(REG["CONTROL"].offset):
                    with m.If(wdata[2]):
                        m.d.sync += [
                            self.soft_reset.eq(1),
                            self.pause_req.eq(0),
                            self.irq_enable.eq(0),
                            self.irq_pending.eq(0),
                            self.program_base.eq(0),
                            self.resume_pc.eq(0),
                            self.resume_tokens.eq(0),
                            self.ring_base.eq(0),
                            self.ring_size.eq(0),
                            self.ring_tail.eq(0),
                            self.dram_base.eq(0),
                            self.dram_limit.eq(0),
                            fence_count.eq(0),
                        ]
                        m.d.comb += self.timeout_next.eq(0)
                    with m.Else():
                        m.d.sync += [
                            self.start.eq(wdata[0] & (self.status != 0b00010)),
                            self.pause_req.eq(wdata[1]),
                            self.irq_enable.eq(wdata[3]),
                        ]
                with m.Case(REG["IRQ"].offset):
                    with m.If(wdata[0]):
                        m.d.sync += self.irq_pending.eq(0)
                with m.Case(REG["PROGRAM_BASE"].offset):
                    m.d.sync += self.program_base.eq(wdata)
                with m.Case(REG["RESUME_PC"].offset):
                    m.d.sync += self.resume_pc.eq(wdata)
                with m.Case(REG["TIMEOUT"].offset):
                    m.d.comb += self.timeout_next.eq(wdata)
                for i in range(3):
                    with m.Case(REG[f"RESUME_TOKENS{i}"].offset):
                        m.d.sync += self.resume_tokens[32 * i : 32 * i + 32].eq(wdata)
                with m.Case(REG["RING_BASE"].offset):
                    m.d.sync += self.ring_base.eq(wdata)
                with m.Case(REG["RING_SIZE"].offset):
                    m.d.sync += self.ring_size.eq(wdata)
                with m.Case(REG["RING_TAIL"].offset):
                    m.d.sync += self.ring_tail.eq(wdata)
                with m.Case(REG["DRAM_BASE"].offset):
                    m.d.sync += self.dram_base.eq(wdata)
                with m.Case(REG["DRAM_LIMIT"].offset):
                    m.d.sync += self.dram_limit.eq(wdata)

        # ---- read channel ---------------------------------------------------------------------------
        hi_latch = Signal(32)
        m.d.comb += bus.arready.eq(~bus.rvalid)
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        with m.If(bus.arvalid & ~bus.rvalid):
            m.d.sync += [bus.rvalid.eq(1), bus.rdata.eq(0)]
            with m.Switch(bus.araddr):
                simple = {
                    "ID": Const(NPU_MAGIC, 32),
                    "VERSION": Const(ISA_VERSION, 32),
                    "CONFIG_ID": Const(self.cfg.config_id, 32),
                    "CONTROL": Cat(Const(0, 1), self.pause_req, Const(0, 1), self.irq_enable),
                    "STATUS": Mux(self.waiting, Status.WAITING, self.status),
                    "IRQ": self.irq_pending,
                    "PROGRAM_BASE": self.program_base,
                    "RESUME_PC": self.resume_pc,
                    "CP_ID": self.cp_id,
                    "ERROR_CODE": self.error_code,
                    "ERROR_PC": self.error_pc,
                    "TIMEOUT": self.timeout,
                    "RING_BASE": self.ring_base,
                    "RING_SIZE": self.ring_size,
                    "RING_TAIL": self.ring_tail,
                    "RING_HEAD": self.ring_head,
                    "FENCE_COUNT": fence_count,
                    "DRAM_BASE": self.dram_base,
                    "DRAM_LIMIT": self.dram_limit,
                    "FAULT_ADDR": self.fault_addr,
                }
                for i in range(3):
                    simple[f"RESUME_TOKENS{i}"] = self.resume_tokens[32 * i : 32 * i + 32]
                for name, value in simple.items():
                    with m.Case(REG[name].offset):
                        m.d.sync += bus.rdata.eq(value)
                for r in REGISTERS:
                    if r.wide:
                        cnt = getattr(self, f"cnt_{r.name.lower()}")
                        with m.Case(r.offset):
                            m.d.sync += [bus.rdata.eq(cnt[:32]), hi_latch.eq(cnt[32:])]
                        with m.Case(r.offset + 4):
                            m.d.sync += bus.rdata.eq(hi_latch)
        return m
