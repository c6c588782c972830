"""An SDR SDRAM controller with an AXI4 slave front: the ULX3S's 32 MB IS42S16160-class chip as the
DRAM behind the core's AXI4 port.

The chip: 16-bit data, 4 banks of 8192 rows (A0-A12) by 512 columns, CAS latency 2 or 3
(`SdramGeometry`, `SdramTiming`). The controller (`SdramController`):

* powers the chip up: waits `t_init_us` with CKE high and NOPs, precharges all banks, issues
  `init_refreshes` auto refreshes and loads the mode register (burst length 1, sequential, the
  CAS latency, burst read and write);
* refreshes periodically: a timer raises a request every `t_refi_ns` less a margin that covers the
  worst wait for a refresh (a row that must stay open tRAS, write recovery, tRP), so the time
  between two refreshes never exceeds tREFI. A request has priority over every access: it is
  served between two SDRAM column accesses, even in the middle of an AXI burst (precharge all,
  auto refresh, wait tRFC), and the burst continues after it;
* keeps a row open per bank (open-row policy) and precharges a bank only when an access misses
  its open row (or for a refresh); every per-bank and global timing (tRCD, tRAS, tRC, tRP, tWR,
  tRRD, tRFC, tMRD, read-to-write bus turnaround) is a small down counter;
* serves AXI INCR bursts as sequences of SDRAM column accesses with burst length 1, one READ or
  WRITE command per cycle: an AXI beat of `W` bits is `W / 16` consecutive SDRAM words (low word
  first), the byte strobes of a beat become the DQM masks of its words.

Address map: the AXI byte address (modulo 32 MB) is a word address (byte address / 2) split, from
the lowest bit, into column (9 bits), bank (2) and row (13). Consecutive 1 KiB stretches lie in
consecutive banks, so a 4 KiB burst (which never crosses a 4 KiB boundary) touches the same row of
each bank at most once and a sequential stream keeps four rows open.

AXI: one transaction at a time; when both AR and AW are waiting they are taken alternately (neither
starves). Only full-width beats (AxSIZE = log2(W / 8)) are supported; FIXED and WRAP bursts are
served as INCR. The start address is aligned down to a beat. Responses are OKAY and echo the id.
W beats go through a 4-beat FIFO (they may arrive before their AW), R beats through an 8-beat
FIFO: a beat's READ commands are issued only when the FIFO has room reserved for it, so RREADY
held low only stalls the SDRAM command stream and never loses data. BVALID follows the last WRITE
command of the burst and waits for BREADY.

Timing and latency assumptions: every SDRAM output (CKE, command, address, bank, DQM, DQ and its
output enable) comes from a flop, and DQ is captured in an input register. Number the chip's
clock edges by the controller's: a command registered at controller edge E is sampled by the
chip at its edge E + 1 (its clock lags the controller's by less than a cycle), and the chip
drives the read data for its edge E + 1 + CL. `read_delay` says which controller edge captures
it: E + 1 + CL + read_delay.

* `read_delay=0`: the chip's clock is in phase with the controller's, or lags it by less than
  the chip's output hold time (data captured at E + 1 + CL, the edge the chip sampled it for).
* `read_delay=-1`: the chip's clock is the controller's inverted (`connect_pins` drives it so):
  the chip samples a command half a cycle after it was registered, its data for edge
  E + 1 + CL (E + 0.5 + CL in controller time) is valid from tAC after E - 0.5 + CL and is
  captured at E + CL. This works while tAC plus the pad and board delays, and the command's
  clock-to-pad delay plus the chip's setup time, fit in half a clock period (about 60 MHz).
* `read_delay=1` or 2: extra register stages on the way in.

Read data is usable in the cycle after the capture: CL + 2 + read_delay cycles after its READ
command was registered. A WRITE command carries its data in the same cycle (DQ driven with it),
and is registered at least CL + 2 (+ read_delay when positive) cycles after the last READ, so the
chip has released DQ.

Throughput, latency and size as measured: docs/boards.md, "The SDRAM controller".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from amaranth import C, Cat, ClockSignal, Module, Mux, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from ..axi import AxiSignature
from ..common import log2

__all__ = [
    "SdramCycles",
    "SdramTiming",
    "SdramGeometry",
    "SdramPins",
    "SdramController",
    "connect_pins",
    "CMD_NOP",
    "CMD_ACTIVE",
    "CMD_READ",
    "CMD_WRITE",
    "CMD_PRECHARGE",
    "CMD_REFRESH",
    "CMD_LOAD_MODE",
]

# commands as (ras_n, cas_n, we_n) with cs_n low
CMD_NOP = 0b111
CMD_ACTIVE = 0b011
CMD_READ = 0b101
CMD_WRITE = 0b100
CMD_PRECHARGE = 0b010
CMD_REFRESH = 0b001
CMD_LOAD_MODE = 0b000


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9)  # 20 ns at 100 MHz is 2 cycles, not 3 through rounding


@dataclass(frozen=True)
class SdramCycles:
    """Timings in clock cycles (minimums rounded up, maximums down)."""

    rcd: int  # ACTIVE -> READ/WRITE, same bank
    rp: int  # PRECHARGE -> ACTIVE/REFRESH
    rfc: int  # AUTO REFRESH -> any command
    rc: int  # ACTIVE -> ACTIVE, same bank
    ras: int  # ACTIVE -> PRECHARGE, minimum
    ras_max: int  # ACTIVE -> PRECHARGE, maximum
    rrd: int  # ACTIVE -> ACTIVE, other bank
    wr: int  # last WRITE -> PRECHARGE
    mrd: int  # LOAD MODE -> any command
    cl: int  # CAS latency
    refi: int  # average refresh interval (maximum)
    init: int  # power-up wait
    init_refreshes: int


@dataclass(frozen=True)
class SdramTiming:
    """Chip timings (ns unless the name says otherwise). The defaults are conservative figures for
    an IS42S16160-class chip of the -7 speed grade (check them against the fitted part's data
    sheet); `t_refi_ns` is 64 ms / 8192 rows. `cas_latency` 2 needs a clock period of at least
    10 ns on that grade, 3 works up to 143 MHz. Tests shorten `t_init_us` and `t_refi_ns`."""

    t_rcd_ns: float = 20.0
    t_rp_ns: float = 20.0
    t_rfc_ns: float = 70.0  # = tRC for auto refresh
    t_rc_ns: float = 70.0
    t_ras_ns: float = 45.0
    t_ras_max_ns: float = 100_000.0
    t_rrd_ns: float = 15.0
    t_wr_ns: float = 15.0
    t_wr_clk: int = 2  # write recovery: at least this many clocks as well
    t_mrd_clk: int = 2
    cas_latency: int = 3
    t_refi_ns: float = 64e6 / 8192
    t_init_us: float = 200.0
    init_refreshes: int = 2

    def __post_init__(self):
        if self.cas_latency not in (2, 3):
            raise ValueError(f"SdramTiming: cas_latency={self.cas_latency} must be 2 or 3")
        if self.init_refreshes < 1:
            raise ValueError("SdramTiming: init_refreshes must be at least 1")

    def cycles(self, clock_mhz: float) -> SdramCycles:
        """The timings in cycles of a `clock_mhz` clock: minimum times rounded up (at least one
        cycle), maximum times (tREFI, tRAS max) rounded down."""
        if clock_mhz <= 0:
            raise ValueError("clock_mhz must be positive")

        def ns(t: float) -> int:
            return max(1, _ceil(t * clock_mhz / 1000))

        return SdramCycles(
            rcd=ns(self.t_rcd_ns),
            rp=ns(self.t_rp_ns),
            rfc=ns(self.t_rfc_ns),
            rc=ns(self.t_rc_ns),
            ras=ns(self.t_ras_ns),
            ras_max=math.floor(self.t_ras_max_ns * clock_mhz / 1000 + 1e-9),
            rrd=ns(self.t_rrd_ns),
            wr=max(ns(self.t_wr_ns), self.t_wr_clk),
            mrd=max(1, self.t_mrd_clk),
            cl=self.cas_latency,
            refi=math.floor(self.t_refi_ns * clock_mhz / 1000 + 1e-9),
            init=max(1, _ceil(self.t_init_us * clock_mhz)),
            init_refreshes=self.init_refreshes,
        )


@dataclass(frozen=True)
class SdramGeometry:
    """The chip's organisation: data bits, banks, row and column address bits."""

    data_bits: int = 16
    banks: int = 4
    row_bits: int = 13
    col_bits: int = 9

    def __post_init__(self):
        if self.data_bits % 8 or self.data_bits & (self.data_bits - 1):
            raise ValueError("SdramGeometry: data_bits must be 8, 16, 32...")
        if self.banks & (self.banks - 1) or self.banks < 2:
            raise ValueError("SdramGeometry: banks must be a power of two")
        if self.col_bits > 10:
            raise ValueError("SdramGeometry: at most 10 column bits (A10 is the precharge-all bit)")

    @property
    def bank_bits(self) -> int:
        return log2(self.banks)

    @property
    def addr_bits(self) -> int:
        """Width of the A bus: the row address, and at least A10."""
        return max(self.row_bits, 11)

    @property
    def data_bytes(self) -> int:
        return self.data_bits // 8

    @property
    def word_bits(self) -> int:
        """Bits of a word address (column, bank, row)."""
        return self.col_bits + self.bank_bits + self.row_bits

    @property
    def size(self) -> int:
        """Bytes."""
        return self.data_bytes << self.word_bits

    def split(self, word: int) -> tuple[int, int, int]:
        """(bank, row, column) of word address `word` (modulo the size): the controller's map."""
        word &= (1 << self.word_bits) - 1
        col = word & ((1 << self.col_bits) - 1)
        bank = (word >> self.col_bits) & (self.banks - 1)
        row = word >> (self.col_bits + self.bank_bits)
        return bank, row, col

    def join(self, bank: int, row: int, col: int) -> int:
        return (row << (self.col_bits + self.bank_bits)) | (bank << self.col_bits) | col


class SdramPins(wiring.Signature):
    """The chip's pins seen from the controller (outputs point to the chip). The bidirectional DQ
    is split into `dq_o` / `dq_oe` (one enable for all bits) and `dq_i`; control lines are active
    low as on the chip. The SDRAM clock pin is not here: a board top drives it. `connect_pins`
    wires them to the amaranth-boards `sdram` resource (the ULX3S's)."""

    def __init__(self, geometry: SdramGeometry = SdramGeometry()):
        self.geometry = g = geometry
        super().__init__(
            {
                "clk_en": Out(1),
                "cs_n": Out(1),
                "we_n": Out(1),
                "ras_n": Out(1),
                "cas_n": Out(1),
                "a": Out(g.addr_bits),
                "ba": Out(g.bank_bits),
                "dqm": Out(g.data_bytes),
                "dq_o": Out(g.data_bits),
                "dq_oe": Out(1),
                "dq_i": In(g.data_bits),
            }
        )

    def __eq__(self, other):
        return isinstance(other, SdramPins) and self.geometry == other.geometry

    def __repr__(self):
        return f"SdramPins({self.geometry!r})"


def connect_pins(m: Module, pins, res, *, domain: str = "sync") -> None:
    """Wire a controller's `pins` to a requested amaranth-boards `SDRAMResource`, e.g.
    `platform.request("sdram", 0, xdr={"clk": 2})` of `amaranth_boards.ulx3s`: CKE, the control
    lines (the resource's `cs`, `we`, `ras`, `cas` are active high, inverted at the pins), A, BA,
    DQM, and the tristate DQ (`dq.o` from `dq_o`, `dq.oe` from `dq_oe`, `dq_i` from `dq.i`).
    The SDRAM clock is `domain`'s clock inverted: through the pin's DDR output register if the
    resource was requested with `xdr={"clk": 2}`, else through logic. Build the controller with
    `read_delay=-1` for this clock."""
    m.d.comb += [
        res.clk_en.o.eq(pins.clk_en),
        res.cs.o.eq(~pins.cs_n),
        res.we.o.eq(~pins.we_n),
        res.ras.o.eq(~pins.ras_n),
        res.cas.o.eq(~pins.cas_n),
        res.a.o.eq(pins.a),
        res.ba.o.eq(pins.ba),
        res.dqm.o.eq(pins.dqm),
        res.dq.o.eq(pins.dq_o),
        res.dq.oe.eq(pins.dq_oe),
        pins.dq_i.eq(res.dq.i),
    ]
    if hasattr(res.clk, "o0"):
        # low for the first half of the cycle, high for the second: the clock inverted
        m.d.comb += [res.clk.o_clk.eq(ClockSignal(domain)), res.clk.o0.eq(0), res.clk.o1.eq(1)]
    else:
        m.d.comb += res.clk.o.eq(~ClockSignal(domain))


class _Timer:
    """A down counter: `load(m)` makes `ok` false for the next `n` - 1 cycles, so a command
    registered `n` or more cycles after the loading one may go."""

    def __init__(self, m: Module, n: int, name: str):
        self.n = n
        self.count = Signal(range(max(n, 2)), name=name)
        self.ok = self.count == 0
        m.d.sync += self.count.eq(Mux(self.count == 0, 0, self.count - 1))

    def load(self, m: Module) -> None:
        if self.n > 1:
            m.d.sync += self.count.eq(self.n - 1)


class SdramController(wiring.Component):
    """AXI4 slave (`bus`, data width `data_width`: 32, 64, 128 or 256) over one SDR SDRAM
    (`pins`). `clock_mhz` is the controller's clock; `timing` and `geometry` the chip's (the
    refresh interval is `timing.t_refi_ns`). `read_delay` (-1..2) places the capture of read
    data relative to the chip's clock (see the module docstring). `addr_width` and `id_width` are
    the bus's; address bits above the chip's size are ignored (the memory repeats)."""

    R_DEPTH = 8  # R beats buffered
    W_DEPTH = 4  # W beats buffered

    def __init__(
        self,
        *,
        data_width: int = 128,
        clock_mhz: float = 50.0,
        timing: SdramTiming = SdramTiming(),
        geometry: SdramGeometry = SdramGeometry(),
        addr_width: int = 32,
        id_width: int = 4,
        read_delay: int = 0,
    ):
        g = geometry
        if data_width % g.data_bits or data_width // g.data_bits not in (2, 4, 8, 16):
            raise ValueError(
                f"SdramController: data_width={data_width} must be 2, 4, 8 or 16 times the chip's "
                f"{g.data_bits} data bits"
            )
        if not -1 <= read_delay <= 2:
            raise ValueError("SdramController: read_delay must be -1..2")
        self.data_width, self.clock_mhz, self.timing, self.geometry = data_width, clock_mhz, timing, g
        self.read_delay = read_delay
        self.cyc = cyc = timing.cycles(clock_mhz)
        # worst wait from a refresh request to the REFRESH command: a row just opened (tRAS, or
        # a write's recovery), precharge all, tRP, plus the decision and command cycles
        self.refresh_margin = max(cyc.ras, cyc.rc - cyc.rp, cyc.wr + 1) + cyc.rp + 4
        self.refresh_period = cyc.refi - self.refresh_margin
        if self.refresh_period < self.refresh_margin + cyc.rfc:
            raise ValueError(
                f"SdramController: refresh interval of {cyc.refi} cycles is too short at {clock_mhz} MHz"
            )
        self.size = g.size
        super().__init__(
            {
                "bus": In(AxiSignature(data_width=data_width, addr_width=addr_width, id_width=id_width)),
                "pins": Out(SdramPins(g)),
            }
        )

    def elaborate(self, platform):
        m = Module()
        g, cyc, bus, pins = self.geometry, self.cyc, self.bus, self.pins
        W, D = self.data_width, g.data_bits
        K = W // D  # SDRAM words per beat
        lk = log2(K)
        lb = log2(W // 8)  # byte address bits inside a beat
        nb = g.banks

        # ---- the SDRAM outputs: flops ----
        cke = Signal(init=0)
        cs_n = Signal(init=1)
        cmd = Signal(3, init=CMD_NOP)  # ras_n, cas_n, we_n
        a = Signal(g.addr_bits)
        ba = Signal(g.bank_bits)
        dqm = Signal(g.data_bytes)
        dq_o = Signal(D)
        dq_oe = Signal()
        m.d.comb += [
            pins.clk_en.eq(cke),
            pins.cs_n.eq(cs_n),
            pins.ras_n.eq(cmd[2]),
            pins.cas_n.eq(cmd[1]),
            pins.we_n.eq(cmd[0]),
            pins.a.eq(a),
            pins.ba.eq(ba),
            pins.dqm.eq(dqm),
            pins.dq_o.eq(dq_o),
            pins.dq_oe.eq(dq_oe),
        ]
        m.d.sync += [cke.eq(1), cmd.eq(CMD_NOP), dq_oe.eq(0), dqm.eq(0)]

        def issue(command, bank=None, addr=None):
            m.d.sync += [cs_n.eq(0), cmd.eq(command)]
            if bank is not None:
                m.d.sync += ba.eq(bank)
            if addr is not None:
                m.d.sync += a.eq(addr)

        # ---- timers ----
        rcd = [_Timer(m, cyc.rcd, f"rcd{b}") for b in range(nb)]
        ras = [_Timer(m, cyc.ras, f"ras{b}") for b in range(nb)]
        rc = [_Timer(m, cyc.rc, f"rc{b}") for b in range(nb)]
        rp = [_Timer(m, cyc.rp, f"rp{b}") for b in range(nb)]
        wr = [_Timer(m, cyc.wr, f"wr{b}") for b in range(nb)]
        rrd = _Timer(m, cyc.rrd, "rrd")
        rfc = _Timer(m, cyc.rfc, "rfc")
        mrd = _Timer(m, cyc.mrd, "mrd")
        turn = _Timer(m, cyc.cl + 2 + max(0, self.read_delay), "turn")  # READ -> WRITE
        quiet = rfc.ok & mrd.ok  # any command may go

        is_open = Signal(nb)
        open_row = [Signal(g.row_bits, name=f"open_row{b}") for b in range(nb)]
        all_pre_ok = Signal()  # every bank may be precharged
        all_act_ok = Signal()  # every bank is past tRP and tRC (REFRESH may go)
        m.d.comb += [
            all_pre_ok.eq(Cat(*[ras[b].ok & wr[b].ok for b in range(nb)]).all()),
            all_act_ok.eq(Cat(*[rp[b].ok & rc[b].ok for b in range(nb)]).all()),
        ]

        # ---- refresh timer ----
        running = Signal()  # initialisation done
        ref_req = Signal()
        ref_count = Signal(range(self.refresh_period + 1))
        with m.If(running):
            with m.If(ref_count == 0):
                m.d.sync += [ref_count.eq(self.refresh_period - 1), ref_req.eq(1)]
            with m.Else():
                m.d.sync += ref_count.eq(ref_count - 1)

        # ---- the AXI transaction being served ----
        active = Signal()
        is_write = Signal()
        tid = Signal(len(bus.arid))
        waddr = Signal(g.word_bits)  # next SDRAM word
        left = Signal(range((256 << lk) + 1))  # words still to access
        r_left = Signal(8)  # R beats after the one being offered
        b_pending = Signal()
        write_last = Signal()  # the last transaction taken was a write (fairness)
        col = waddr[: g.col_bits]
        bank = waddr[g.col_bits : g.col_bits + g.bank_bits]
        row = waddr[g.col_bits + g.bank_bits :]
        word_idx = waddr[:lk]

        # ---- buffers ----
        m.submodules.rfifo = rfifo = fifo.SyncFIFOBuffered(width=W, depth=self.R_DEPTH)
        m.submodules.wfifo = wfifo = fifo.SyncFIFOBuffered(width=W + W // 8, depth=self.W_DEPTH)
        reserved = Signal(range(self.R_DEPTH + 1))  # R beats whose reads have started, not yet sent
        m.d.comb += [
            wfifo.w_data.eq(Cat(bus.wdata, bus.wstrb)),
            wfifo.w_en.eq(bus.wvalid),
            bus.wready.eq(wfifo.w_rdy),
            bus.rvalid.eq(rfifo.r_rdy),
            bus.rdata.eq(rfifo.r_data),
            bus.rlast.eq(r_left == 0),
            bus.rid.eq(tid),
            bus.rresp.eq(0),
            rfifo.r_en.eq(bus.rready),
            bus.bvalid.eq(b_pending),
            bus.bid.eq(tid),
            bus.bresp.eq(0),
        ]
        r_fire = Signal()
        m.d.comb += r_fire.eq(bus.rvalid & bus.rready)
        with m.If(r_fire):
            m.d.sync += r_left.eq(r_left - 1)
            with m.If(r_left == 0):
                m.d.sync += active.eq(0)
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += [b_pending.eq(0), active.eq(0)]

        # ---- read data: the input register, the valid pipeline, beats assembled into rfifo ----
        dq_cap = Signal(D)
        m.d.sync += dq_cap.eq(pins.dq_i)
        rd_issue = Signal()
        lat = cyc.cl + 2 + self.read_delay
        rd_pipe = Signal(lat)
        m.d.sync += rd_pipe.eq(Cat(rd_issue, rd_pipe[:-1]))
        rd_valid = rd_pipe[lat - 1]
        asm = Signal((K - 1) * D)
        asm_n = Signal(lk)
        m.d.comb += rfifo.w_data.eq(Cat(asm, dq_cap))
        with m.If(rd_valid):
            m.d.sync += [asm.eq(Cat(asm[D:], dq_cap)), asm_n.eq(asm_n + 1)]
            with m.If(asm_n == K - 1):
                m.d.comb += rfifo.w_en.eq(1)
        beat_start = Signal()  # the READ issued now is the first word of a beat
        m.d.comb += beat_start.eq(rd_issue & (word_idx == 0))
        m.d.sync += reserved.eq(reserved + beat_start - r_fire)

        # ---- write data: the word of the head beat ----
        w_words = wfifo.r_data[:W]
        w_strb = wfifo.r_data[W:]
        w_word = Signal(D)
        w_mask = Signal(g.data_bytes)
        with m.Switch(word_idx):
            for i in range(K):
                with m.Case(i):
                    m.d.comb += [
                        w_word.eq(w_words[i * D : (i + 1) * D]),
                        w_mask.eq(~w_strb[i * g.data_bytes : (i + 1) * g.data_bytes]),
                    ]

        # ---- the selected bank's state ----
        sel_open = Signal()
        sel_hit = Signal()
        sel_act_ok = Signal()
        sel_pre_ok = Signal()
        sel_rw_ok = Signal()
        with m.Switch(bank):
            for b in range(nb):
                with m.Case(b):
                    m.d.comb += [
                        sel_open.eq(is_open[b]),
                        sel_hit.eq(open_row[b] == row),
                        sel_act_ok.eq(rp[b].ok & rc[b].ok),
                        sel_pre_ok.eq(ras[b].ok & wr[b].ok),
                        sel_rw_ok.eq(rcd[b].ok),
                    ]

        def load_bank(timers, which):
            """Load the timer of bank `which` (a signal)."""
            with m.Switch(which):
                for b in range(nb):
                    with m.Case(b):
                        timers[b].load(m)

        init_count = Signal(range(cyc.init + 1), init=cyc.init)
        init_refs = Signal(range(cyc.init_refreshes + 1))
        mode = cyc.cl << 4  # burst length 1, sequential, CAS latency, burst write

        with m.FSM():
            with m.State("POWERUP"):
                m.d.sync += [cs_n.eq(0), init_count.eq(init_count - 1)]  # NOPs
                with m.If(init_count == 0):
                    issue(CMD_PRECHARGE, addr=1 << 10)
                    for t in rp:
                        t.load(m)
                    m.next = "INIT_REFRESH"
            with m.State("INIT_REFRESH"):
                with m.If(all_act_ok & rfc.ok):
                    issue(CMD_REFRESH)
                    rfc.load(m)
                    m.d.sync += init_refs.eq(init_refs + 1)
                    with m.If(init_refs == cyc.init_refreshes - 1):
                        m.next = "INIT_MODE"
            with m.State("INIT_MODE"):
                with m.If(rfc.ok):
                    issue(CMD_LOAD_MODE, bank=0, addr=mode)
                    mrd.load(m)
                    m.d.sync += running.eq(1)
                    m.next = "RUN"
            with m.State("RUN"):
                # take a transaction: AR and AW alternately when both wait
                take_read = Signal()
                take_write = Signal()
                m.d.comb += [
                    take_read.eq(~active & bus.arvalid & (write_last | ~bus.awvalid)),
                    take_write.eq(~active & bus.awvalid & ~take_read),
                    bus.arready.eq(take_read),
                    bus.awready.eq(take_write),
                ]
                with m.If(take_read | take_write):
                    addr = Mux(take_read, bus.araddr, bus.awaddr)
                    length = Mux(take_read, bus.arlen, bus.awlen)
                    m.d.sync += [
                        active.eq(1),
                        is_write.eq(take_write),
                        write_last.eq(take_write),
                        tid.eq(Mux(take_read, bus.arid, bus.awid)),
                        waddr.eq(Cat(C(0, lk), addr[lb : lb + g.word_bits - lk])),
                        left.eq((length + 1) << lk),
                        r_left.eq(length),
                    ]

                work = Signal()
                m.d.comb += work.eq(active & (left != 0))
                data_ok = Signal()
                m.d.comb += data_ok.eq(
                    Mux(is_write, wfifo.r_rdy & turn.ok, (word_idx != 0) | (reserved < self.R_DEPTH))
                )
                with m.If(ref_req):
                    with m.If(is_open.any()):
                        with m.If(quiet & all_pre_ok):
                            issue(CMD_PRECHARGE, addr=1 << 10)
                            m.d.sync += is_open.eq(0)
                            for b in range(nb):
                                with m.If(is_open[b]):
                                    rp[b].load(m)
                    with m.Elif(quiet & all_act_ok):
                        issue(CMD_REFRESH)
                        rfc.load(m)
                        m.d.sync += ref_req.eq(0)
                with m.Elif(work & quiet):
                    with m.If(~sel_open):
                        with m.If(sel_act_ok & rrd.ok):
                            issue(CMD_ACTIVE, bank=bank, addr=row)
                            for b in range(nb):
                                with m.If(bank == b):
                                    m.d.sync += [is_open[b].eq(1), open_row[b].eq(row)]
                            for timers in (rcd, ras, rc):
                                load_bank(timers, bank)
                            rrd.load(m)
                    with m.Elif(~sel_hit):
                        with m.If(sel_pre_ok):
                            issue(CMD_PRECHARGE, bank=bank, addr=0)
                            for b in range(nb):
                                with m.If(bank == b):
                                    m.d.sync += is_open[b].eq(0)
                            load_bank(rp, bank)
                    with m.Elif(sel_rw_ok & data_ok):
                        m.d.sync += [waddr.eq(waddr + 1), left.eq(left - 1)]
                        with m.If(is_write):
                            issue(CMD_WRITE, bank=bank, addr=col)
                            m.d.sync += [dq_o.eq(w_word), dqm.eq(w_mask), dq_oe.eq(1)]
                            load_bank(wr, bank)
                            with m.If(word_idx == K - 1):
                                m.d.comb += wfifo.r_en.eq(1)
                            with m.If(left == 1):
                                m.d.sync += b_pending.eq(1)
                        with m.Else():
                            issue(CMD_READ, bank=bank, addr=col)
                            m.d.comb += rd_issue.eq(1)
                            turn.load(m)
        return m
