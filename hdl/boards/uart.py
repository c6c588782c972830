"""UART receiver and transmitter, 8N1, for the serial bridge (docs/driver.md).

`divisor` is clock cycles per bit (clock_hz / baud, at least 4). The receiver synchronises the line
with two flops, finds the start bit's falling edge, checks the start bit again half a bit later and
then samples every bit in its middle; a stop bit that reads 0 drops the byte and pulses `error` (a
framing error), and the receiver waits for the line to go idle (high) before the next start bit. It
cannot be held up: `stream` is always ready, a byte is there for the one cycle `valid` is high.

The transmitter takes a byte when `stream.valid` and `stream.ready` (it is ready while idle) and
sends start bit, 8 data bits (LSB first) and stop bit; `tx` idles high.
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out


def divisor_of(clk_freq: float, baud: float) -> int:
    """Clock cycles per bit; a UART 8N1 link tolerates a few per cent of rate error."""
    div = round(clk_freq / baud)
    if div < 4:
        raise ValueError(f"{baud} baud needs at least 4 cycles per bit ({clk_freq} Hz gives {div})")
    if abs(clk_freq / div - baud) > 0.02 * baud:
        raise ValueError(f"{baud} baud is more than 2% off {clk_freq} Hz / {div}")
    return div


class UartRx(wiring.Component):
    """`rx`: the line (idle high). `stream`: received bytes. `error`: a one-cycle pulse per byte with a
    bad stop bit (not delivered)."""

    def __init__(self, divisor: int):
        if divisor < 4:
            raise ValueError("UartRx needs at least 4 cycles per bit")
        self.divisor = divisor
        super().__init__(
            {
                "rx": In(1, init=1),
                "stream": Out(stream.Signature(8, always_ready=True)),
                "error": Out(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        div = self.divisor
        s1 = Signal(init=1)
        line = Signal(init=1)
        m.d.sync += [s1.eq(self.rx), line.eq(s1)]  # two-flop synchroniser
        cnt = Signal(range(div))
        bit = Signal(range(9))
        shreg = Signal(8)
        m.d.comb += self.stream.payload.eq(shreg)
        m.d.sync += [self.stream.valid.eq(0), self.error.eq(0)]
        with m.If(cnt != 0):
            m.d.sync += cnt.eq(cnt - 1)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += cnt.eq(div // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(cnt == 0):
                    with m.If(line):
                        m.next = "IDLE"  # a glitch, not a start bit
                    with m.Else():
                        m.d.sync += [cnt.eq(div - 1), bit.eq(0)]
                        m.next = "DATA"
            with m.State("DATA"):
                with m.If(cnt == 0):
                    m.d.sync += [shreg.eq(Cat(shreg[1:], line)), cnt.eq(div - 1), bit.eq(bit + 1)]
                    with m.If(bit == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(cnt == 0):
                    with m.If(line):
                        m.d.sync += self.stream.valid.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += self.error.eq(1)
                        m.next = "BREAK"
            with m.State("BREAK"):  # after a framing error: wait for the idle line
                with m.If(line):
                    m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """`stream`: bytes to send. `tx`: the line (idle high)."""

    def __init__(self, divisor: int):
        if divisor < 1:
            raise ValueError("UartTx needs at least 1 cycle per bit")
        self.divisor = divisor
        super().__init__({"stream": In(stream.Signature(8)), "tx": Out(1, init=1)})

    def elaborate(self, platform):
        m = Module()
        div = self.divisor
        cnt = Signal(range(div))
        left = Signal(range(11))  # bits still to send (start, 8 data, stop)
        shreg = Signal(10, init=0x3FF)
        m.d.comb += [self.tx.eq(shreg[0]), self.stream.ready.eq(left == 0)]
        with m.If(left == 0):
            with m.If(self.stream.valid):
                m.d.sync += [shreg.eq(Cat(0, self.stream.payload, 1)), left.eq(10), cnt.eq(div - 1)]
        with m.Elif(cnt != 0):
            m.d.sync += cnt.eq(cnt - 1)
        with m.Else():
            m.d.sync += [shreg.eq(Cat(shreg[1:], 1)), left.eq(left - 1), cnt.eq(div - 1)]
        return m
