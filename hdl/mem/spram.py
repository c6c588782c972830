"""The iCE40 UP5K's single-port RAMs (SPRAM) as the DRAM behind the core's AXI4 port.

The UP5K has four `SB_SPRAM256KA` blocks of 16K x 16 bits (32 KiB each, 128 KiB together). The
adapter puts `W / 16` of them side by side as one word of the AXI data width `W` (16, 32 or 64) and
the rest above each other: 16K x 64 bits for the `icebreaker` preset's 64-bit bus.

An SPRAM has one port: a cycle either reads (data the next cycle) or writes a word with a nibble
mask. So the adapter serves one AXI transaction at a time, choosing between a waiting read and a
waiting write alternately (neither starves). Reads stream one beat per cycle: a 3-entry buffer in
front of R keeps issuing reads while earlier beats wait for RREADY, and never issues one it could
not hold. Writes take one beat per cycle, byte strobes as nibble masks. Bursts are INCR with
full-width beats (the core's DMA and the serial bridge issue nothing else); addresses wrap modulo
the memory's size.

`sim=True` swaps each `SB_SPRAM256KA` primitive for `SpramModel`, an Amaranth memory with the same
ports and behaviour (registered read, output held while not reading, nibble-masked writes), so
the board top simulates with the same adapter logic that the bitstream holds.
"""

from __future__ import annotations

from amaranth import Cat, ClockSignal, Instance, Module, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..axi import AxiSignature
from ..common import log2

BLOCK_WORDS = 16 * 1024  # 16-bit words per SB_SPRAM256KA
BLOCKS = 4  # on an iCE40 UP5K
BLOCK_BYTES = 2 * BLOCK_WORDS
SPRAM_BYTES = BLOCKS * BLOCK_BYTES


class SpramBlockSignature(wiring.Signature):
    """One SPRAM's ports (seen from the user): address, data in, nibble write mask, write enable,
    chip select; data out."""

    def __init__(self):
        super().__init__(
            {
                "addr": Out(14),
                "wdata": Out(16),
                "mask": Out(4),
                "wren": Out(1),
                "cs": Out(1),
                "rdata": In(16),
            }
        )


class SpramModel(wiring.Component):
    """Simulation model of one `SB_SPRAM256KA`: registered read, nibble-masked write. `init`: its
    first contents (16-bit words from address 0; the primitive powers up with none)."""

    def __init__(self, init: list[int] | None = None):
        self.init = list(init or [])
        super().__init__({"port": In(SpramBlockSignature())})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = Memory(shape=unsigned(16), depth=BLOCK_WORDS, init=self.init)
        wp = mem.write_port(granularity=4)
        rp = mem.read_port(domain="sync")
        p = self.port
        m.d.comb += [
            wp.addr.eq(p.addr),
            wp.data.eq(p.wdata),
            wp.en.eq(Cat(*[p.cs & p.wren & p.mask[i] for i in range(4)])),
            rp.addr.eq(p.addr),
            rp.en.eq(p.cs & ~p.wren),
            p.rdata.eq(rp.data),
        ]
        return m


class SpramPrimitive(wiring.Component):
    """One `SB_SPRAM256KA` of the iCE40 UP5K, always powered and awake."""

    def __init__(self):
        super().__init__({"port": In(SpramBlockSignature())})

    def elaborate(self, platform):
        m = Module()
        p = self.port
        m.submodules.spram = Instance(
            "SB_SPRAM256KA",
            i_ADDRESS=p.addr,
            i_DATAIN=p.wdata,
            i_MASKWREN=p.mask,
            i_WREN=p.wren,
            i_CHIPSELECT=p.cs,
            i_CLOCK=ClockSignal("sync"),
            i_STANDBY=0,
            i_SLEEP=0,
            i_POWEROFF=1,  # active low
            o_DATAOUT=p.rdata,
        )
        return m


class SpramAxi(wiring.Component):
    """An AXI4 slave of data width `data_width` (16, 32 or 64 bits) over `blocks` of the four SPRAMs
    (the micro core keeps two for its on-chip memory)."""

    def __init__(
        self,
        data_width: int = 64,
        *,
        blocks: int = BLOCKS,
        addr_width: int = 32,
        id_width: int = 4,
        sim: bool = False,
    ):
        if data_width not in (16, 32, 64):
            raise ValueError(f"SPRAM adapter: data_width={data_width} must be 16, 32 or 64")
        if not 1 <= blocks <= BLOCKS or blocks % (data_width // 16):
            raise ValueError(
                f"SPRAM adapter: {blocks} blocks do not make whole {data_width}-bit words (of {BLOCKS})"
            )
        self.W, self.sim, self.blocks = data_width, sim, blocks
        self.wide = data_width // 16  # blocks side by side
        self.deep = blocks // self.wide  # rows of blocks
        self.size = blocks * BLOCK_BYTES
        bus = AxiSignature(data_width=data_width, addr_width=addr_width, id_width=id_width)
        super().__init__({"bus": In(bus)})

    def elaborate(self, platform):
        m = Module()
        bus, W = self.bus, self.W
        lw = log2(W // 8)  # address bits inside a word
        words = self.size // (W // 8)
        blocks = []
        for b in range(self.blocks):
            blk = SpramModel() if self.sim else SpramPrimitive()
            m.submodules[f"spram{b}"] = blk
            blocks.append(blk.port)

        # the transaction being served
        tid = Signal(len(bus.arid))
        word = Signal(range(words))  # next word to access
        left = Signal(9)  # beats still to issue
        write_last = Signal()  # the last transaction served was a write (fairness)

        # the word's row of blocks and address inside a block
        row = Signal(range(max(2, self.deep)))
        baddr = Signal(14)
        m.d.comb += baddr.eq(word[:14])
        if self.deep > 1:
            m.d.comb += row.eq(word[14:])
        access = Signal()  # access the blocks this cycle
        wren = Signal()
        for b, p in enumerate(blocks):
            col, r = b % self.wide, b // self.wide
            m.d.comb += [
                p.addr.eq(baddr),
                p.cs.eq(access & (row == r)),
                p.wren.eq(wren),
                p.wdata.eq(bus.wdata[16 * col : 16 * col + 16]),
                p.mask.eq(Cat(*[bus.wstrb[2 * col + i // 2] for i in range(4)])),
            ]

        # read data: the blocks' outputs the cycle after a read, through a buffer to R
        m.submodules.rbuf = rbuf = SyncFIFO(width=W + 1, depth=3)
        pending = Signal()  # a read issued last cycle: its data is on the blocks' outputs now
        pending_last = Signal()
        pending_row = Signal.like(row)
        rdata = Signal(W)
        for b, p in enumerate(blocks):
            col, r = b % self.wide, b // self.wide
            with m.If(pending_row == r):
                m.d.comb += rdata[16 * col : 16 * col + 16].eq(p.rdata)
        m.d.comb += [
            rbuf.w_data.eq(Cat(rdata, pending_last)),
            rbuf.w_en.eq(pending),
            bus.rvalid.eq(rbuf.r_rdy),
            bus.rdata.eq(rbuf.r_data[:W]),
            bus.rlast.eq(rbuf.r_data[W]),
            bus.rid.eq(tid),
            bus.rresp.eq(0),
            rbuf.r_en.eq(bus.rready),
            bus.bid.eq(tid),
            bus.bresp.eq(0),
        ]
        m.d.sync += [pending.eq(0)]

        with m.FSM():
            with m.State("IDLE"):
                take_read = Signal()
                m.d.comb += take_read.eq(bus.arvalid & (write_last | ~bus.awvalid))
                with m.If(take_read):
                    m.d.comb += bus.arready.eq(1)
                    m.d.sync += [
                        tid.eq(bus.arid),
                        word.eq(bus.araddr[lw:]),
                        left.eq(bus.arlen + 1),
                        write_last.eq(0),
                    ]
                    m.next = "READ"
                with m.Elif(bus.awvalid):
                    m.d.comb += bus.awready.eq(1)
                    m.d.sync += [tid.eq(bus.awid), word.eq(bus.awaddr[lw:]), write_last.eq(1)]
                    m.next = "WRITE"
            with m.State("READ"):
                # issue a read only if the buffer will hold its data whatever R does meanwhile
                with m.If((left != 0) & (rbuf.level + pending < 3)):
                    m.d.comb += access.eq(1)
                    m.d.sync += [
                        pending.eq(1),
                        pending_last.eq(left == 1),
                        pending_row.eq(row),
                        word.eq(word + 1),
                        left.eq(left - 1),
                    ]
                # done when the last beat has left through R
                with m.If((left == 0) & ~pending & (rbuf.level == 0)):
                    m.next = "IDLE"
            with m.State("WRITE"):
                m.d.comb += bus.wready.eq(1)
                with m.If(bus.wvalid):
                    m.d.comb += [access.eq(1), wren.eq(1)]
                    m.d.sync += word.eq(word + 1)
                    with m.If(bus.wlast):
                        m.next = "RESP"
            with m.State("RESP"):
                m.d.comb += bus.bvalid.eq(1)
                with m.If(bus.bready):
                    m.next = "IDLE"
        return m
