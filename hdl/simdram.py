"""Simulation-only AXI4 RAM and a harness top (`NpuSimTop`) with the core wired to it.

cocotbext-axi's `AxiRam` checks the AXI protocol but runs Python on every cycle it is active, which
limits long runs to a few tens of thousands of cycles per second. For long runs the bench can use
this RAM instead: it lives in the simulator, serves one beat per cycle (INCR bursts, byte strobes,
one read and one write burst at a time), and the bench loads and reads it through the simulator's
handle to its memory array. Both paths are tested against the golden model.
"""

from __future__ import annotations

from amaranth import Cat, ClockDomain, ClockSignal, DomainRenamer, Module, Mux, ResetSignal, Signal, unsigned
from amaranth.lib import fifo, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig, get_config

from .common import log2
from .core import NpuCore, axi_master_signature
from .regs import axil_signature


class SimDram(wiring.Component):
    def __init__(self, cfg: NpuConfig, size: int):
        self.cfg = cfg
        self.size = size
        # the slave side of the master signature: flip every member
        sig = {
            name: (In if m.flow == Out else Out)(m.shape)
            for name, m in wiring.Signature(axi_master_signature(cfg)).members.items()
        }
        super().__init__(sig)

    def elaborate(self, platform):
        m = Module()
        W = self.cfg.bus_bytes
        lw = log2(W)
        m.submodules.mem = mem = Memory(shape=unsigned(8 * W), depth=self.size // W, init=[])
        rp = mem.read_port(domain="comb")
        wp = mem.write_port(granularity=8)
        aw = log2(self.size // W)

        # reads: addresses queue up (like AxiRam, several bursts may be outstanding), data streams
        # one beat per cycle
        m.submodules.arq = arq = fifo.SyncFIFOBuffered(width=40, depth=4)
        r_busy = Signal()
        r_addr = Signal(32)
        r_left = Signal(9)
        m.d.comb += [
            self.m_axi_arready.eq(arq.w_rdy),
            arq.w_en.eq(self.m_axi_arvalid),
            arq.w_data.eq(Cat(self.m_axi_araddr, self.m_axi_arlen)),
            rp.addr.eq(r_addr[lw : lw + aw]),
            self.m_axi_rdata.eq(rp.data),
            self.m_axi_rvalid.eq(r_busy),
            self.m_axi_rlast.eq(r_left == 0),
            self.m_axi_rid.eq(0),
            self.m_axi_rresp.eq(0),
        ]
        last_beat = r_busy & self.m_axi_rready & (r_left == 0)
        m.d.comb += arq.r_en.eq((~r_busy | last_beat) & arq.r_rdy)
        with m.If(r_busy & self.m_axi_rready):
            m.d.sync += [r_addr.eq(r_addr + W), r_left.eq(r_left - 1)]
            with m.If(r_left == 0):
                m.d.sync += r_busy.eq(0)
        with m.If(arq.r_en):
            m.d.sync += [r_busy.eq(1), r_addr.eq(arq.r_data[:32]), r_left.eq(arq.r_data[32:])]

        # writes: address, then data beats, then one response
        w_busy = Signal()
        w_addr = Signal(32)
        b_pending = Signal()
        m.d.comb += [
            self.m_axi_awready.eq(~w_busy & ~b_pending),
            self.m_axi_wready.eq(w_busy),
            wp.addr.eq(w_addr[lw : lw + aw]),
            wp.data.eq(self.m_axi_wdata),
            wp.en.eq(Mux(self.m_axi_wvalid & w_busy, self.m_axi_wstrb, 0)),
            self.m_axi_bvalid.eq(b_pending),
            self.m_axi_bid.eq(0),
            self.m_axi_bresp.eq(0),
        ]
        with m.If(self.m_axi_awvalid & self.m_axi_awready):
            m.d.sync += [w_busy.eq(1), w_addr.eq(self.m_axi_awaddr)]
        with m.If(w_busy & self.m_axi_wvalid):
            m.d.sync += w_addr.eq(w_addr + W)
            with m.If(self.m_axi_wlast):
                m.d.sync += [w_busy.eq(0), b_pending.eq(1)]
        with m.If(b_pending & self.m_axi_bready):
            m.d.sync += b_pending.eq(0)
        return m


class NpuSimTop(wiring.Component):
    """NpuCore + SimDram; the AXI4-Lite register port and the interrupt are the top's ports."""

    def __init__(self, config: NpuConfig | str, dram_size: int):
        self.cfg = get_config(config)
        self.dram_size = dram_size
        super().__init__({**axil_signature(), "irq": Out(1)})

    def elaborate(self, platform):
        m = Module()
        # The design runs in a domain whose reset comes from a register, not straight from the
        # `rst` port: Verilator re-evaluates all logic that depends on a primary input whenever
        # any input (the clock included) changes, and every register's next state depends on reset.
        m.domains.npu = npu = ClockDomain("npu", local=True)
        rst_q = Signal(init=1)
        m.d.sync += rst_q.eq(ResetSignal("sync"))
        m.d.comb += [npu.clk.eq(ClockSignal("sync")), npu.rst.eq(rst_q)]
        m.submodules.core = core = DomainRenamer("npu")(NpuCore(self.cfg))
        m.submodules.dram = dram = DomainRenamer("npu")(SimDram(self.cfg, self.dram_size))
        for name in axi_master_signature(self.cfg):
            if core.signature.members[name].flow == Out:
                m.d.comb += getattr(dram, name).eq(getattr(core, name))
            else:
                m.d.comb += getattr(core, name).eq(getattr(dram, name))
        for name in axil_signature():
            if self.signature.members[name].flow == Out:
                m.d.comb += getattr(self, name).eq(getattr(core, name))
            else:
                m.d.comb += getattr(core, name).eq(getattr(self, name))
        m.d.comb += self.irq.eq(core.irq)
        return m
