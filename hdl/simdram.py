"""Simulation-only AXI4 RAM and a harness top (`NpuSimTop`) with the core wired to it.

cocotbext-axi's `AxiRam` checks the AXI protocol but runs Python on every cycle it is active, which
limits long runs to a few tens of thousands of cycles per second. For long runs the bench can use
this RAM instead: it lives in the simulator, serves one beat per cycle (INCR bursts, byte strobes,
one read and one write burst at a time), and the bench loads and reads it through the simulator's
handle to its memory array. Both paths are tested against the golden model.
"""

from __future__ import annotations

from amaranth import Cat, ClockDomain, ClockSignal, DomainRenamer, Instance, Module, Mux, ResetSignal, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig, get_config

from .axi import AxiSignature
from .common import log2
from .core import dram_signature, regs_signature
from .engine import engine_core
from .soc import NpuSoc, soc_regs_signature

SLVERR = 0b10

#: The RAM's array, in Verilog: a megabyte array as an Amaranth Memory becomes one initialiser line
#: per word, which Yosys and Verilator take minutes over; a loop initialises this one. The bench
#: reads and writes it through its handle (`mem`). Reads are combinational, writes byte-masked.
SIM_DRAM_VERILOG = """
module npu_sim_dram_array #(parameter WIDTH = 64, parameter DEPTH = 1024, parameter AW = 10) (
    input clk,
    input [AW-1:0] raddr,
    output [WIDTH-1:0] rdata,
    input [AW-1:0] waddr,
    input [WIDTH/8-1:0] wen,
    input [WIDTH-1:0] wdata
);
    reg [WIDTH-1:0] mem [0:DEPTH-1];
    integer i, b;
    initial for (i = 0; i < DEPTH; i = i + 1) mem[i] = {WIDTH{1'b0}};
    assign rdata = mem[raddr];
    always @(posedge clk)
        for (b = 0; b < WIDTH / 8; b = b + 1)
            if (wen[b]) mem[waddr][b * 8 +: 8] <= wdata[b * 8 +: 8];
endmodule
"""


class SimDram(wiring.Component):
    """The RAM. With `stall_en` high, every channel is throttled pseudo-randomly (a 16-bit LFSR from
    reset, about one cycle in four per channel): AR, AW and W drop READY, R and B hold back VALID
    (never withdrawing a VALID already shown), as a busy interconnect or DRAM controller would. A port,
    not a build parameter, so one simulator build serves runs with and without stalls.

    `fault_lo`/`fault_hi`: beats at addresses in [fault_lo, fault_hi) are answered with SLVERR (reads
    return zeros, writes are dropped and the burst's response is SLVERR), as a faulting slave would."""

    def __init__(self, cfg: NpuConfig, size: int, bus: AxiSignature | None = None):
        """`bus`: the AXI4 signature served (the core's by default); ids are echoed in R and B."""
        self.cfg = cfg
        self.size = size
        super().__init__(
            {"bus": In(bus or dram_signature(cfg)), "fault_lo": In(32), "fault_hi": In(32), "stall_en": In(1)}
        )

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        W = self.cfg.bus_bytes
        lw = log2(W)
        aw = log2(self.size // W)
        rp_addr, rp_data = Signal(aw), Signal(8 * W)
        wp_addr, wp_data, wp_en = Signal(aw), Signal(8 * W), Signal(W)
        m.submodules.mem = Instance(
            "npu_sim_dram_array",
            p_WIDTH=8 * W, p_DEPTH=self.size // W, p_AW=aw,
            i_clk=ClockSignal("sync"), i_raddr=rp_addr, o_rdata=rp_data,
            i_waddr=wp_addr, i_wen=wp_en, i_wdata=wp_data,
        )  # fmt: skip
        # per-channel stall bits (all zero unless `stall_en`, registered: a primary input in the
        # handshake logic would make Verilator re-evaluate it on every input change)
        stall = {ch: Signal(name=f"stall_{ch}") for ch in ("ar", "r", "aw", "w", "b")}
        en = Signal()
        lfsr = Signal(16, init=0xACE1)
        m.d.sync += [en.eq(self.stall_en), lfsr.eq(Cat(lfsr[1:], lfsr[0] ^ lfsr[2] ^ lfsr[3] ^ lfsr[5]))]
        for k, s in enumerate(stall.values()):
            m.d.comb += s.eq(en & lfsr[2 * k] & lfsr[2 * k + 1])
        r_shown = Signal()  # R beat offered and not yet taken: it must stay valid
        b_shown = Signal()

        # reads: addresses queue up (like AxiRam, several bursts may be outstanding), data streams
        # one beat per cycle
        iw = len(bus.arid)
        m.submodules.arq = arq = fifo.SyncFIFOBuffered(width=40 + iw, depth=4)
        r_busy = Signal()
        r_addr = Signal(32)
        r_left = Signal(9)
        r_id = Signal(iw)
        m.d.comb += [
            bus.arready.eq(arq.w_rdy & ~stall["ar"]),
            arq.w_en.eq(bus.arvalid & ~stall["ar"]),
            arq.w_data.eq(Cat(bus.araddr, bus.arlen, bus.arid)),
            rp_addr.eq(r_addr[lw : lw + aw]),
            bus.rdata.eq(Mux(self._faulting(r_addr), 0, rp_data)),
            bus.rvalid.eq(r_busy & (r_shown | ~stall["r"])),
            bus.rlast.eq(r_left == 0),
            bus.rid.eq(r_id),
            bus.rresp.eq(Mux(self._faulting(r_addr), SLVERR, 0)),
        ]
        m.d.sync += r_shown.eq(bus.rvalid & ~bus.rready)
        last_beat = bus.rvalid & bus.rready & (r_left == 0)
        m.d.comb += arq.r_en.eq((~r_busy | last_beat) & arq.r_rdy)
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += [r_addr.eq(r_addr + W), r_left.eq(r_left - 1)]
            with m.If(r_left == 0):
                m.d.sync += r_busy.eq(0)
        with m.If(arq.r_en):
            m.d.sync += [
                r_busy.eq(1),
                r_addr.eq(arq.r_data[:32]),
                r_left.eq(arq.r_data[32:40]),
                r_id.eq(arq.r_data[40:]),
            ]

        # writes: address, then data beats, then one response
        w_busy = Signal()
        w_addr = Signal(32)
        w_fault = Signal()  # a beat of this burst hit the faulting range
        w_id = Signal(len(bus.awid))
        b_pending = Signal()
        m.d.comb += [
            bus.awready.eq(~w_busy & ~b_pending & ~stall["aw"]),
            bus.wready.eq(w_busy & ~stall["w"]),
            wp_addr.eq(w_addr[lw : lw + aw]),
            wp_data.eq(bus.wdata),
            wp_en.eq(Mux(bus.wvalid & bus.wready & ~self._faulting(w_addr), bus.wstrb, 0)),
            bus.bvalid.eq(b_pending & (b_shown | ~stall["b"])),
            bus.bid.eq(w_id),
            bus.bresp.eq(Mux(w_fault, SLVERR, 0)),
        ]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += [w_busy.eq(1), w_addr.eq(bus.awaddr), w_fault.eq(0), w_id.eq(bus.awid)]
        with m.If(bus.wvalid & bus.wready):
            m.d.sync += w_addr.eq(w_addr + W)
            with m.If(self._faulting(w_addr)):
                m.d.sync += w_fault.eq(1)
            with m.If(bus.wlast):
                m.d.sync += [w_busy.eq(0), b_pending.eq(1)]
        m.d.sync += b_shown.eq(bus.bvalid & ~bus.bready)
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += b_pending.eq(0)
        return m

    def _faulting(self, addr):
        return (addr >= self.fault_lo) & (addr < self.fault_hi)


class NpuSimTop(wiring.Component):
    """NpuCore (or, with `soc`, NpuSoc) + SimDram; the AXI4-Lite register port and the interrupt(s)
    are the top's ports. With `ext_dram` high (from reset on) the core's AXI4 master is the top's
    `bus` port instead (m_axi_*: the bench serves it with cocotbext-axi's AxiRam), so one simulator
    build serves both memories (docs/simulation.md)."""

    def __init__(
        self, config: NpuConfig | str, dram_size: int, soc: bool = False, flash_boot: bool | bytes = False
    ):
        self.cfg = get_config(config)
        self.dram_size = dram_size
        self.soc = soc
        # a micro core boots from a model of the SPI flash holding this (True: `flash_image()`)
        self.flash_boot = flash_boot
        self._inner = NpuSoc(self.cfg) if soc else engine_core(self.cfg, bool(flash_boot))
        # fault_lo/fault_hi: the RAM's faulting range, stall_en its random stalls (see SimDram), set
        # by the bench
        ports = {"ctrl": In(soc_regs_signature() if soc else regs_signature()), "irq": Out(1)}
        if soc:
            ports["irqs"] = Out(self.cfg.engines)
        ports["bus"] = Out(self._inner.signature.members["bus"].signature)
        super().__init__(
            {**ports, "fault_lo": In(32), "fault_hi": In(32), "stall_en": In(1), "ext_dram": In(1)}
        )

    def elaborate(self, platform):
        m = Module()
        # The design runs in a domain whose reset comes from a register, not straight from the
        # `rst` port: Verilator re-evaluates all logic that depends on a primary input whenever
        # any input (the clock included) changes, and every register's next state depends on reset.
        m.domains.npu = npu = ClockDomain("npu", local=True)
        rst_q = Signal(init=1)
        m.d.sync += rst_q.eq(ResetSignal("sync"))
        m.d.comb += [npu.clk.eq(ClockSignal("sync")), npu.rst.eq(rst_q)]
        inner = self._inner
        m.submodules.core = core = DomainRenamer("npu")(inner)
        if self.flash_boot:
            from .mem.spiflash import SpiFlashModel
            from .micro import memmap
            from .micro.firmware import flash_image

            image = flash_image() if self.flash_boot is True else self.flash_boot
            flash = SpiFlashModel(image, memmap.FLASH_FIRMWARE)
            m.submodules.flash = DomainRenamer("npu")(flash)
            wiring.connect(m, inner.flash, flash.pins)
        bus_sig = inner.signature.members["bus"].signature
        ram = SimDram(self.cfg, self.dram_size, bus=bus_sig)
        m.submodules.dram = dram = DomainRenamer("npu")(ram)
        # the core's bus to the in-simulator RAM or to the `bus` port; the select is registered (a
        # primary input in the handshake logic would make Verilator re-evaluate it on every input
        # change) and only VALIDs are gated: the other side never sees a request
        ext = Signal()
        m.d.sync += ext.eq(self.ext_dram)
        for name, member in bus_sig.members.items():
            c, d, x = getattr(core.bus, name), getattr(dram.bus, name), getattr(self.bus, name)
            if member.flow == Out:
                valid = name.endswith("valid")
                m.d.comb += [d.eq(c & ~ext if valid else c), x.eq(c & ext if valid else c)]
            else:
                m.d.comb += c.eq(Mux(ext, x, d))
        wiring.connect(m, wiring.flipped(self.ctrl), core.ctrl)
        if self.soc:
            m.d.comb += self.irqs.eq(core.irqs)
        m.d.comb += [
            self.irq.eq(core.irq),
            dram.fault_lo.eq(self.fault_lo),
            dram.fault_hi.eq(self.fault_hi),
            dram.stall_en.eq(self.stall_en),
        ]
        return m
