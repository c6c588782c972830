"""Board tops: the core (or the SoC) + board DRAM + the UART bridge of the serial protocol + LEDs.

    UART --- SerialBridge --regs (AXI4-Lite)--> NpuCore / NpuSoc --irq--> bridge (ends a WAIT)
                   |                                 |
                   |                          AxiRegisterSlice
                   +--dram (AXI4)--+  +--bus (AXI4)--+
                                   AxiInterconnect (round-robin per burst)
                                          |
                     SdramController (ULX3S) or SpramAxi (iCEBreaker)

`BoardCore` is that system without the board's pins: UART `rx`/`tx`, the DRAM's pins when the DRAM
is off-chip, and status outputs (`running`, `irq`, `error`). `BoardTop` puts it on an
`amaranth-boards` platform: a PLL from the board's oscillator to the core clock, reset from the
PLL's lock and the reset button (synchronised), the SDRAM's clock pin driven with the core clock
inverted through a DDR output (the chip samples mid-cycle), LEDs for running / interrupt / error /
a heartbeat. With `sim=True` the vendor primitives are swapped for simulation models (the SPRAM
model; the SDRAM's pins come out to a cocotb bus-functional model), so `npu.sim` runs the same top.
"""

from __future__ import annotations

from amaranth import ClockDomain, ClockSignal, Module, Signal
from amaranth.lib import io, wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig
from npu.registers import REG, WINDOW_BYTES, Status

from ..axi import AxiRegisterSlice
from ..core import dram_signature
from ..engine import engine_core
from ..mem.sdram import SdramController, SdramPins
from ..mem.spram import BLOCKS as SPRAM_BLOCKS
from ..mem.spram import SpramAxi
from ..micro.core import SPRAMS as MICRO_SPRAMS
from ..micro.core import flash_signature
from ..soc import AxiInterconnect, NpuSoc, soc_dram_signature
from .boards import Board
from .bridge import SerialBridge
from .pll import Ecp5Pll, Ice40Pll

#: DRAM payload per serial packet on the boards (the bridge's two block RAMs are sized by it)
MAX_PACKET = 256
#: clock cycles per UART bit in simulation (a fast link keeps the simulated runs short)
SIM_DIVISOR = 8


class BoardCore(wiring.Component):
    """The board's system without pins (see the module docstring)."""

    def __init__(self, board: Board, cfg: NpuConfig, clock_mhz: float, sim: bool = False):
        self.board, self.cfg, self.clock_mhz, self.sim = board, cfg, clock_mhz, sim
        if cfg.dram_bytes > board.dram_bytes:
            raise ValueError(
                f"config {cfg.name}: {cfg.dram_bytes} bytes of DRAM, {board.name} has {board.dram_bytes}"
            )
        members = {
            "rx": In(1, init=1),
            "tx": Out(1, init=1),
            "running": Out(1),
            "irq": Out(1),
            "error": Out(1),
        }
        if board.dram == "sdram":
            members["sdram"] = Out(SdramPins())
        if cfg.core == "micro":  # the boot loader reads the firmware from the SPI flash
            members["flash"] = Out(flash_signature())
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg, board = self.cfg, self.board
        W = 8 * cfg.bus_bytes
        soc = cfg.engines > 1
        m.submodules.npu = npu = NpuSoc(cfg) if soc else engine_core(cfg)
        master = soc_dram_signature(cfg) if soc else dram_signature(cfg)
        # the STATUS the bridge's WAIT polls: the core's, or engine 0's window in the SoC
        status = REG["STATUS"].offset + (WINDOW_BYTES if soc else 0)
        m.submodules.bridge = bridge = SerialBridge(
            dram_bytes=cfg.dram_bytes,
            data_width=W,
            clk_freq=self.clock_mhz * 1e6,
            baud=board.baud if not self.sim else None,
            divisor=SIM_DIVISOR if self.sim else None,
            max_packet=MAX_PACKET,
            reg_addr_width=len(npu.ctrl.awaddr),
            id_width=master.id_width,
            status_offset=status,
        )
        m.d.comb += [bridge.rx.eq(self.rx), self.tx.eq(bridge.tx), bridge.irq.eq(npu.irq)]
        if cfg.core == "micro":
            wiring.connect(m, npu.flash, wiring.flipped(self.flash))
        wiring.connect(m, bridge.regs, npu.ctrl)

        m.submodules.ic = ic = AxiInterconnect(2, master)
        if cfg.core == "micro":  # one beat at a time at 12 MHz: no slice (the UP5K's cells are few)
            wiring.connect(m, npu.bus, ic.masters[0])
        else:
            # a register slice between the core and the interconnect: the core's handshakes end in
            # it rather than running through the arbitration and the DRAM controller (Fmax)
            m.submodules.slice = cut = AxiRegisterSlice(master)
            wiring.connect(m, npu.bus, cut.s)
            wiring.connect(m, cut.m, ic.masters[0])
        wiring.connect(m, bridge.dram, ic.masters[1])
        bus = ic.bus.signature
        if board.dram == "sdram":
            m.submodules.dram = dram = SdramController(
                data_width=W,
                clock_mhz=self.clock_mhz,
                addr_width=bus.addr_width,
                id_width=bus.id_width,
                read_delay=-1,  # BoardTop clocks the chip with the core clock inverted
            )
            wiring.connect(m, dram.pins, wiring.flipped(self.sdram))
        else:
            # the micro core keeps two SPRAMs for its scratchpad, accumulators and firmware data
            blocks = SPRAM_BLOCKS - (MICRO_SPRAMS if cfg.core == "micro" else 0)
            m.submodules.dram = dram = SpramAxi(
                W, blocks=blocks, addr_width=bus.addr_width, id_width=bus.id_width, sim=self.sim
            )
            if cfg.dram_bytes > dram.size:
                raise ValueError(
                    f"config {cfg.name}: {cfg.dram_bytes} bytes of DRAM, but {blocks} SPRAMs hold {dram.size}"
                )
        wiring.connect(m, ic.bus, dram.bus)

        # status lines from the STATUS the bridge reads (the core has one register port)
        m.d.comb += self.irq.eq(npu.irq)
        regs, st, ar = bridge.regs, Signal(32), Signal(len(bridge.regs.araddr))
        with m.If(regs.arvalid & regs.arready):
            m.d.sync += ar.eq(regs.araddr)
        with m.If(regs.rvalid & regs.rready & (ar == status)):
            m.d.sync += st.eq(regs.rdata)
        m.d.comb += [
            self.running.eq((st & int(Status.RUNNING)) != 0),
            self.error.eq((st & int(Status.ERROR)) != 0),
        ]
        return m


class BoardTop(wiring.Component):
    """`BoardCore` on the board's `amaranth-boards` platform (pins, PLL, reset, LEDs)."""

    def __init__(self, board: Board, cfg: NpuConfig, clock_mhz: float):
        self.board, self.cfg, self.clock_mhz = board, cfg, clock_mhz
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        board = self.board

        def pin(name: str, direction: str, number: int = 0) -> io.Buffer:
            buf = io.Buffer(direction, platform.request(name, number, dir="-"))
            m.submodules[f"{name}{number}_buf"] = buf
            return buf

        m.domains.sync = ClockDomain("sync")
        clk, locked = Signal(name="clk_core"), Signal(name="pll_locked")
        if board.family == "ecp5":
            Ecp5Pll.search(board.osc_mhz, self.clock_mhz).elaborate_into(
                m, pin(board.osc, "i").i, clk, locked
            )
            # nextpnr derives the PLL output's constraint from the oscillator's (a constraint on
            # the output net would be lost: synthesis renames it)
        elif self.clock_mhz == board.osc_mhz:  # the oscillator's pin carries its own constraint
            m.d.comb += [clk.eq(pin(board.osc, "i").i), locked.eq(1)]
        else:  # the iCE40 PLL takes the pad itself
            pad = platform.request(board.osc, 0, dir="-")
            Ice40Pll.search(board.osc_mhz, self.clock_mhz).elaborate_into(m, pad.io, clk, locked)
            platform.add_clock_constraint(clk, self.clock_mhz * 1e6)
        m.d.comb += ClockSignal("sync").eq(clk)
        m.submodules.reset = ResetSynchronizer(~locked | pin(board.reset_button, "i").i, domain="sync")

        m.submodules.system = system = BoardCore(board, self.cfg, self.clock_mhz)
        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_rx = rx = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = tx = io.Buffer("o", uart.tx)
        m.d.comb += [system.rx.eq(rx.i), tx.o.eq(system.tx)]
        if self.cfg.core == "micro":  # the firmware's SPI flash, one data line each way
            fl = platform.request("spi_flash_1x", 0, dir="-")
            outs = {"cs": ~system.flash.cs_n, "clk": system.flash.sck, "copi": system.flash.copi,
                    "wp": 0, "hold": 0}  # fmt: skip  (the platform inverts cs, wp and hold)
            for name, value in outs.items():
                m.submodules[f"flash_{name}"] = b = io.Buffer("o", getattr(fl, name))
                m.d.comb += b.o.eq(value)
            m.submodules.flash_cipo = ci = io.Buffer("i", fl.cipo)
            m.d.comb += system.flash.cipo.eq(ci.i)
        if board.dram == "sdram":
            pins = platform.request("sdram", 0, dir="-")
            p = system.sdram
            # the chip's clock is the core's inverted (a DDR output: low, then high, each cycle)
            m.submodules.sdram_clk = ck = io.DDRBuffer("o", pins.clk)
            m.d.comb += [ck.o[0].eq(0), ck.o[1].eq(1)]
            outs = {
                "clk_en": p.clk_en,
                "cs": ~p.cs_n,
                "we": ~p.we_n,
                "ras": ~p.ras_n,
                "cas": ~p.cas_n,
                "a": p.a,
                "ba": p.ba,
                "dqm": p.dqm,
            }  # fmt: skip  (the platform inverts the *_n pins)
            for name, value in outs.items():
                m.submodules[f"sdram_{name}"] = b = io.Buffer("o", getattr(pins, name))
                m.d.comb += b.o.eq(value)
            m.submodules.sdram_dq = dq = io.Buffer("io", pins.dq)
            m.d.comb += [dq.o.eq(p.dq_o), dq.oe.eq(p.dq_oe), p.dq_i.eq(dq.i)]

        # LEDs: running, interrupt pending, error, heartbeat (as many as the board has)
        beat = Signal(range(int(self.clock_mhz * 1e6)))
        blink = Signal()
        m.d.sync += beat.eq(beat + 1)
        with m.If(beat == int(self.clock_mhz * 1e6) // 2 - 1):
            m.d.sync += [beat.eq(0), blink.eq(~blink)]
        leds = [r for r in platform.resources if r[0] == "led"]
        for i, s in enumerate([system.running, system.irq, system.error, blink][: len(leds)]):
            # two registers between the core and the pin: a LED needs no cycle of its own, and a
            # core signal's path across the die to the pad was the ULX3S build's critical path
            near, far = Signal(name=f"led{i}_near"), Signal(name=f"led{i}_far")
            m.d.sync += [near.eq(s), far.eq(near)]
            m.d.comb += pin("led", "o", i).o.eq(far)
        return m
