"""Clock generation for board tops: an ECP5 EHXPLLL or an iCE40 SB_PLL40 from the board's oscillator.

The divider search follows the parts' data sheets (the ranges `ecppll` and `icepll` use): the
output is the closest reachable frequency to the request; a request too far from anything
reachable is an error naming the range.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth import Instance, Module, Signal

from npu.errors import NpuError


class PllError(NpuError, ValueError):
    pass


@dataclass(frozen=True)
class Ecp5Pll:
    """EHXPLLL: f_out = f_in * fb_div / ref_div, VCO = f_out * op_div in 400..800 MHz."""

    f_in: float
    ref_div: int
    fb_div: int
    op_div: int

    @property
    def f_out(self) -> float:
        return self.f_in * self.fb_div / self.ref_div

    @classmethod
    def search(cls, f_in: float, f_out: float) -> Ecp5Pll:
        best = None
        for ref in range(1, 129):
            if not 3.125 <= f_in / ref <= 400:
                continue
            for fb in range(1, 81):
                out = f_in * fb / ref
                if not 3.125 <= out <= 400:
                    continue
                for op in range(1, 129):
                    if 400 <= out * op <= 800:
                        err = abs(out - f_out)
                        if best is None or err < best[0] - 1e-9:
                            best = (err, cls(f_in, ref, fb, op))
                        break
        if best is None or best[0] > 0.02 * f_out:
            raise PllError(f"ECP5 PLL: {f_out} MHz is not reachable from {f_in} MHz (3.125-400 MHz)")
        return best[1]

    def elaborate_into(self, m: Module, clk_in, clk: Signal, locked: Signal) -> None:
        m.submodules.pll = Instance(
            "EHXPLLL",
            p_PLLRST_ENA="DISABLED",
            p_INTFB_WAKE="DISABLED",
            p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED",
            p_OUTDIVIDER_MUXA="DIVA",
            p_CLKOP_ENABLE="ENABLED",
            p_CLKI_DIV=self.ref_div,
            p_CLKFB_DIV=self.fb_div,
            p_CLKOP_DIV=self.op_div,
            p_CLKOP_CPHASE=self.op_div - 1,
            p_CLKOP_FPHASE=0,
            p_FEEDBK_PATH="CLKOP",
            a_FREQUENCY_PIN_CLKI=str(self.f_in),
            a_FREQUENCY_PIN_CLKOP=f"{self.f_out:.4f}",
            i_RST=0,
            i_STDBY=0,
            i_CLKI=clk_in,
            i_CLKFB=clk,
            i_PHASESEL0=0,
            i_PHASESEL1=0,
            i_PHASEDIR=1,
            i_PHASESTEP=1,
            i_PHASELOADREG=1,
            i_PLLWAKESYNC=0,
            i_ENCLKOP=0,
            o_CLKOP=clk,
            o_LOCK=locked,
        )


@dataclass(frozen=True)
class Ice40Pll:
    """SB_PLL40_PAD: f_out = f_in * (divf + 1) / ((divr + 1) * 2**divq), as `icepll` computes."""

    f_in: float
    divr: int
    divf: int
    divq: int
    filter_range: int

    @property
    def f_out(self) -> float:
        return self.f_in * (self.divf + 1) / ((self.divr + 1) * (1 << self.divq))

    @classmethod
    def search(cls, f_in: float, f_out: float) -> Ice40Pll:
        best = None
        for divr in range(16):
            pfd = f_in / (divr + 1)
            if not 10 <= pfd <= 133:
                continue
            for divf in range(128):
                vco = pfd * (divf + 1)
                if not 533 <= vco <= 1066:
                    continue
                for divq in range(1, 7):
                    out = vco / (1 << divq)
                    err = abs(out - f_out)
                    if best is None or err < best[0] - 1e-9:
                        rng = (
                            next(i for i, lim in enumerate((17, 26, 44, 66, 101, 133, 1e9)) if pfd < lim) + 1
                        )
                        best = (err, cls(f_in, divr, divf, divq, rng))
        if best is None or best[0] > 0.02 * f_out:
            raise PllError(f"iCE40 PLL: {f_out} MHz is not reachable from {f_in} MHz (16-275 MHz)")
        return best[1]

    def elaborate_into(self, m: Module, pad, clk: Signal, locked: Signal) -> None:
        m.submodules.pll = Instance(
            "SB_PLL40_PAD",
            p_FEEDBACK_PATH="SIMPLE",
            p_DIVR=self.divr,
            p_DIVF=self.divf,
            p_DIVQ=self.divq,
            p_FILTER_RANGE=self.filter_range,
            i_PACKAGEPIN=pad,
            i_RESETB=1,
            i_BYPASS=0,
            o_PLLOUTGLOBAL=clk,
            o_LOCK=locked,
        )
