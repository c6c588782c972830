"""Dependency-token channels: a counter for every ordered pair of units (producer -> consumer).

A finishing instruction pushes a token into the channels its `signal` mask names; an instruction
whose `wait` mask names a channel starts only when that channel holds a token and pops it (docs/isa.md).
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig
from npu.isa import Unit
from npu.registers import TOKEN_CHANNELS

#: the channels, in the bit order of the component's vectors (the shared order of the register map)
PAIRS: list[tuple[Unit, Unit]] = [(Unit(p), Unit(c)) for p, c in TOKEN_CHANNELS]


def pair_index(producer: Unit, consumer: Unit) -> int:
    return PAIRS.index((producer, consumer))


class TokenChannels(wiring.Component):
    """`push`/`pop`: one bit per channel (`PAIRS` order), applied together each cycle; `clear` sets
    every channel to its byte of `init` (a START: the RESUME_TOKENS registers). `counts`: every
    channel's count, a byte each (a pause saves them). `nonzero`: a channel holds a token; `full`:
    it holds `token_depth`; `any`: some channel holds a token."""

    def __init__(self, cfg: NpuConfig):
        self.cfg = cfg
        n = len(PAIRS)
        super().__init__(
            {
                "push": In(n),
                "pop": In(n),
                "clear": In(1),
                "init": In(8 * n),
                "counts": Out(8 * n),
                "nonzero": Out(n),
                "full": Out(n),
                "any": Out(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        for i, (p, c) in enumerate(PAIRS):
            name = f"tok_{p.name.lower()}_{c.name.lower()}"
            t = Signal(8, name=name)
            t_next = Signal(8, name=f"{name}_next")
            init = self.init[8 * i : 8 * i + 8]
            m.d.comb += t_next.eq(Mux(self.clear, init, t + self.push[i] - self.pop[i]))
            m.d.comb += self.counts[8 * i : 8 * i + 8].eq(t)
            # the flags are registered with the count, from its next value: the same as compares of
            # the count, but the issue logic starts from flip-flops (Fmax)
            nonzero = Signal(name=f"{name}_nonzero")
            full = Signal(name=f"{name}_full")
            m.d.sync += [t.eq(t_next), nonzero.eq(t_next != 0), full.eq(t_next >= self.cfg.token_depth)]
            m.d.comb += [self.nonzero[i].eq(nonzero), self.full[i].eq(full)]
        m.d.comb += self.any.eq(self.nonzero.any())
        return m
