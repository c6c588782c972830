"""The AXI4 register slice (hdl/axi.py): every beat of every channel passes once, in order, at one
beat per cycle, under random valid and ready on both sides."""

from __future__ import annotations

import random

from amaranth.sim import Simulator

from npu.hdl.axi import AXI_CHANNELS, AxiRegisterSlice, AxiSignature

SIG = AxiSignature(data_width=64, addr_width=32, id_width=2)
#: the payload member each channel's beats are numbered by, and the one that rides along
DATA = {"ar": ("araddr", "arid"), "aw": ("awaddr", "awlen"), "w": ("wdata", "wstrb"),
        "r": ("rdata", "rresp"), "b": ("bresp", "bid")}  # fmt: skip


def _run(p_valid: float, p_ready: float, beats: int = 300, seed: int = 1) -> tuple[dict, dict, int]:
    dut = AxiRegisterSlice(SIG)
    rng = random.Random(seed)
    sent = {ch: [(rng.getrandbits(32), rng.getrandbits(2)) for _ in range(beats)] for ch in AXI_CHANNELS}
    got: dict = {ch: [] for ch in AXI_CHANNELS}
    cycles = [0]

    async def bench(ctx):
        nxt = {ch: 0 for ch in AXI_CHANNELS}
        for _ in range(beats * 20):
            taken = {}
            for ch, (forward, _) in AXI_CHANNELS.items():
                up, down = (dut.s, dut.m) if forward else (dut.m, dut.s)
                a, b = DATA[ch]
                offer = nxt[ch] < beats and rng.random() < p_valid
                ctx.set(getattr(up, f"{ch}valid"), offer)
                if offer:
                    ctx.set(getattr(up, a), sent[ch][nxt[ch]][0])
                    ctx.set(getattr(up, b), sent[ch][nxt[ch]][1])
                ctx.set(getattr(down, f"{ch}ready"), rng.random() < p_ready)
                # this cycle's handshakes, on both sides, before the clock edge
                taken[ch] = offer and ctx.get(getattr(up, f"{ch}ready"))
                if ctx.get(getattr(down, f"{ch}valid")) and ctx.get(getattr(down, f"{ch}ready")):
                    got[ch].append((ctx.get(getattr(down, a)), ctx.get(getattr(down, b))))
            await ctx.tick()
            cycles[0] += 1
            for ch in AXI_CHANNELS:
                nxt[ch] += bool(taken[ch])
            if all(len(got[ch]) == beats for ch in AXI_CHANNELS):
                break

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return sent, got, cycles[0]


def _fit(sent: dict) -> dict:
    """The sent beats as the slice's members hold them (a member's width cuts a random value)."""
    widths = {"araddr": 32, "arid": 2, "awaddr": 32, "awlen": 8, "wdata": 64, "wstrb": 8, "rdata": 64,
              "rresp": 2, "bresp": 2, "bid": 2}  # fmt: skip
    return {ch: [(x % (1 << widths[DATA[ch][0]]), y % (1 << widths[DATA[ch][1]])) for x, y in beats]
            for ch, beats in sent.items()}  # fmt: skip


def test_every_beat_passes_in_order_under_back_pressure():
    for p_valid, p_ready, seed in ((0.7, 0.5, 1), (0.3, 0.9, 2), (1.0, 0.2, 3)):
        sent, got, _ = _run(p_valid, p_ready, seed=seed)
        want = _fit(sent)
        for ch in AXI_CHANNELS:
            assert got[ch] == want[ch], (ch, p_valid, p_ready, len(got[ch]))


def test_full_rate_when_never_stalled():
    sent, got, cycles = _run(1.0, 1.0, beats=200)
    assert got == _fit(sent)
    assert cycles <= 200 + 1  # one beat per cycle after the slice's one cycle of latency
