"""Fast amaranth.sim unit tests of small RTL blocks."""

import random

import pytest
from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st

from npu.config import ACC_BASE, get_config
from npu.hdl.checks import CHECK_LATENCY, InstructionCheck, product_bits
from npu.hdl.common import ByteFifo
from npu.hdl.fetch import ReadArbiter
from npu.hdl.spad import BankedScratchpad, Client
from npu.isa import FORMATS, ErrorCode, Instr, IsaError, Opcode, decode, dram_span, encode, make, validate

CFGS = [get_config("tiny"), get_config("default")]


def _near(cfg):
    """Values near every boundary the checks care about."""
    edges = [
        0,
        1,
        2,
        3,
        4,
        7,
        8,
        15,
        16,
        17,
        31,
        32,
        63,
        64,
        255,
        256,
        cfg.spad_bytes - 16,
        cfg.spad_bytes - 1,
        cfg.spad_bytes,
        ACC_BASE - 4,
        ACC_BASE,
        ACC_BASE + 4,
        ACC_BASE + 16,
        ACC_BASE + cfg.acc_bytes - 16,
        ACC_BASE + cfg.acc_bytes,
        cfg.dram_bytes - 64,
        cfg.dram_bytes,
        cfg.dram_bytes - 1,
    ]
    return edges


def plausible_words(cfg, n, seed):
    """Instruction words that sit near every rule's edge, plus a few corrupted ones."""
    rng = random.Random(seed)
    counts = random.Random(seed + 1)  # a stream of its own: the words' other fields stay as they were
    near = _near(cfg)
    saturation = [(1 << b) + d for bits in product_bits(cfg) for b in (bits - 1, bits) for d in (-1, 0, 1)]
    words = []
    for _ in range(n):
        op = rng.choice(list(Opcode))
        fields = {}
        for f in FORMATS[op]:
            if f.kind == "enum":
                v = rng.randrange(1 << f.width)
                v = min(v, len(f.choices) - 1) if rng.random() < 0.9 else v
            elif f.width >= 20 and rng.random() < 0.6:
                v = rng.choice(near)
            elif rng.random() < 0.5:
                v = rng.choice([0, 1, 2, 3, 4, 5, 8, 16])
            else:
                v = rng.randint(f.lo, f.hi)
            # where the checks' products stop being exact and saturate (npu.hdl.checks)
            if f.width == 16 and counts.random() < 0.15:
                v = counts.choice([255, 256, 257, 0x7FFF, 0x8000, 0x8001, 0xFFFF])
            if f.width >= 20 and counts.random() < 0.15:
                v = counts.choice(saturation)
            fields[f.name] = max(f.lo, min(f.hi, v))
        wait = rng.randrange(16) if rng.random() < 0.3 else 0
        signal = rng.randrange(16) if rng.random() < 0.3 else 0
        word = 0
        try:
            word = int.from_bytes(encode(Instr(op, fields, wait, signal)), "little")
        except IsaError:  # an enum value out of range: pack by hand
            word = int(op)
        if rng.random() < 0.05:
            word |= 1 << rng.randrange(12, 256)
        if rng.random() < 0.03:
            word = (word & ~0xF) | rng.randrange(16)
        words.append(word)
    return words


def python_code(word, cfg, window: tuple[int, int] | None = None) -> int:
    """The model's code: `validate`'s, then the memory window's on a LOAD's or STORE's DRAM range."""
    try:
        ins = decode(word.to_bytes(32, "little"))
        validate(ins, cfg)
    except IsaError as e:
        return int(e.code)
    start, end = dram_span(ins)
    if window is not None and start < end and (start < window[0] or end > window[1]):
        return int(ErrorCode.PROTECTION)
    return 0


#: (opcode, count field, stride field, base field, memory, other fields) of footprints whose size is
#: a product: "spad", "acc" or "dram" as the memory the footprint is placed at the end of
PRODUCT_FOOTPRINTS = [
    ("load", "rows", "spad_stride", "spad", "spad", {"cols": 4, "dram_stride": 4}),
    ("load", "rows", "dram_stride", "dram", "dram", {"cols": 4, "spad_stride": 4}),
    ("store", "rows", "spad_stride", "spad", "spad", {"cols": 4, "dram_stride": 4}),
    ("store", "rows", "dram_stride", "dram", "dram", {"cols": 4, "spad_stride": 4}),
    ("matmul", "m", "a_stride", "a", "spad", {"n": 1, "k": 8, "b_stride": 8, "c": ACC_BASE, "c_stride": 4}),
    ("matmul", "n", "b_stride", "b", "spad", {"m": 1, "k": 8, "a_stride": 8, "c": ACC_BASE, "c_stride": 4}),
    ("matmul", "m", "c_stride", "c", "acc", {"n": 1, "k": 8, "a_stride": 8, "b_stride": 8}),
    ("vmap", "rows", "dst_stride", "dst", "spad", {"cols": 4, "src_stride": 4, "hi": 127}),
    ("vlut", "rows", "src_stride", "src", "spad", {"cols": 4, "dst_stride": 4, "table": 0x100}),
    ("vmul", "rows", "b_stride", "b", "spad", {"cols": 4, "a_stride": 4, "dst_stride": 4, "hi": 127}),
]


def edge_footprints(cfg) -> list[int]:
    """Words whose product footprint ends just inside, at or just past the end of its memory, with
    factors on both sides of the bits where the checks' products saturate: a product cut too early
    changes their codes."""
    size = {"spad": (0, cfg.spad_bytes), "acc": (ACC_BASE, cfg.acc_bytes), "dram": (0, cfg.dram_bytes)}
    align = {"a_stride": cfg.lanes, "b_stride": cfg.lanes, "c_stride": cfg.acc_row_bytes}
    words = []
    for op, count, stride, base, mem, rest in PRODUCT_FOOTPRINTS:
        if op == "matmul":  # its strides aligned as its rules ask
            rest = {k: align.get(k, v) for k, v in rest.items()}
        lo, n = size[mem]
        width = 4 * (rest.get("n", 1)) if stride == "c_stride" else rest.get("cols", rest.get("k", 4))
        for rows in (2, 3, 5, 17, 257, 4097, 0x8000, 0xFFFF):
            a = align.get(stride, 1)
            step = max(a, (n - width) // (rows - 1) // a * a)
            for s in (step - a, step, step + a):
                for slack in (-1, 0, 1):  # the base such that the end is n - slack ... past it
                    start = lo + n - ((rows - 1) * s + width) + slack
                    start = max(lo, start) // a * a if base in ("a", "b", "c") else max(lo, start)
                    words += _encoded(op, **{**rest, count: rows, stride: max(s, 0), base: start})
    # POOL: C * W * rows read and C * out_w * out_h written (second-level products), each half the
    # scratchpad, the written one at its end
    for c in (1, 8, 255, 256, 0x8000):
        for w in (1, 3, 256, 0xFFFF):
            rows = cfg.spad_bytes // 2 // (c * w)
            for h in (rows - 1, rows, rows + 1):
                for slack in (-1, 0, 1):
                    if not 0 < h < 1 << 16:
                        continue
                    dst = max(0, cfg.spad_bytes - h * w * c + slack)
                    words += _encoded("pool", src=0, dst=dst, channels=c, in_w=w, out_h=h, out_w=w,
                                      kh=1, kw=1, sh=1, sw=1, hi=127)  # fmt: skip
    return words


def _encoded(op: str, **fields) -> list[int]:
    """The instruction word, or none where a value is past its field (not an instruction to check)."""
    try:
        return [int.from_bytes(encode(make(op, **fields)), "little")]
    except IsaError:
        return []


def test_edge_footprints_pass_and_fail_where_validate_says():
    """The generator's words really sit on both sides of the memories' ends."""
    cfg = get_config("ulx3s")
    codes = {ErrorCode(python_code(w, cfg)).name for w in edge_footprints(cfg)}
    assert {"NONE", "SPAD_RANGE", "DRAM_RANGE"} <= codes


@pytest.mark.parametrize("window", [None, (0x1000, 0x20000)], ids=["no-window", "window"])
@pytest.mark.parametrize("cfg", [*CFGS, get_config("ulx3s")], ids=lambda c: c.name)
def test_hardware_checks_match_isa_validate(cfg, window):
    words = plausible_words(cfg, 600, seed=cfg.config_id) + edge_footprints(cfg)
    dut = InstructionCheck(cfg)
    got = []

    async def bench(ctx):
        if window is not None:  # else the ports' reset values: no window
            ctx.set(dut.win_base, window[0])
            ctx.set(dut.win_hi, window[1])
        # one word a cycle, with a bubble now and then: every code comes out CHECK_LATENCY later
        sent = 0
        for cycle in range(len(words) * 2 + CHECK_LATENCY):
            bubble = sent < len(words) and cycle % 7 == 3
            ctx.set(dut.valid, sent < len(words) and not bubble)
            if sent < len(words) and not bubble:
                ctx.set(dut.word, words[sent])
                ctx.set(dut.extra, sent & 1)
                sent += 1
            await ctx.tick()
            if ctx.get(dut.out_valid):
                assert ctx.get(dut.out_extra) == len(got) & 1
                got.append((ctx.get(dut.out_word), ctx.get(dut.code)))
            if len(got) == len(words):
                break

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert [w for w, _ in got] == words
    got = [c for _, c in got]
    codes = [python_code(w, cfg, window) for w in words]
    seen = {ErrorCode(c).name for c in codes}
    assert {"NONE", "ILLEGAL_FIELD", "MISALIGNED", "SPAD_RANGE", "DRAM_RANGE"} <= seen
    assert ("PROTECTION" in seen) == (window is not None)
    mismatches = [(hex(w), c, g) for w, c, g in zip(words, codes, got, strict=True) if c != g]
    assert not mismatches, mismatches[:5]


# the load's, 3 words, the store's, a wide bus
@pytest.mark.parametrize("W,cap_words", [(8, 2), (8, 3), (8, 4), (16, 2)])
@settings(max_examples=30)
@given(
    st.lists(
        st.tuples(st.integers(0, 16), st.integers(0, 16), st.binary(min_size=16, max_size=16)),
        min_size=1,
        max_size=60,
    )
)
def test_byte_fifo_is_a_byte_queue(W, cap_words, ops):
    dut = ByteFifo(W, cap_words)
    model: list[int] = []

    async def bench(ctx):
        for push_n, pop_n, data in ops:
            push_n, data = min(push_n, W), data[:W]
            count = ctx.get(dut.count)
            assert count == len(model)
            assert ctx.get(dut.data).to_bytes(W, "little")[: min(count, W)] == bytes(model[:W])
            pop = min(pop_n, count, W)
            ctx.set(dut.pop_n, pop)
            ready = ctx.get(dut.push_ready)
            ctx.set(dut.push_valid, 1)
            ctx.set(dut.push_n, push_n)
            ctx.set(dut.push_data, int.from_bytes(data, "little"))
            await ctx.tick()
            del model[:pop]
            if ready:
                model.extend(data[:push_n])

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 3)), min_size=1, max_size=12),
    st.integers(0, 2**32 - 1),
)
def test_read_arbiter_returns_every_burst_to_its_requester(bursts, seed):
    """Two requesters' bursts share AR/R: each gets exactly its own beats, in order, with random
    back-pressure on both sides."""
    cfg = get_config("tiny")
    dut = ReadArbiter(cfg)
    rng = random.Random(seed)
    reqs = [[(i, n) for i, (who, n) in enumerate(bursts) if who == r] for r in (0, 1)]
    got: list[list[int]] = [[], []]

    async def bench(ctx):
        pending = [list(reqs[0]), list(reqs[1])]
        accepted = []  # bursts in AXI order: (requester, tag, beats)
        beat = 0
        for _ in range(400):
            for r, port in enumerate((dut.ar0, dut.ar1)):
                ctx.set(port.valid, bool(pending[r]))
                if pending[r]:
                    ctx.set(port.payload.addr, pending[r][0][0])
                    ctx.set(port.payload.len, pending[r][0][1])
            ctx.set(dut.m_arready, rng.random() < 0.7)
            for port in (dut.r0, dut.r1):
                ctx.set(port.ready, rng.random() < 0.7)
            serving = accepted[0] if accepted else None
            ctx.set(dut.m_rvalid, serving is not None)
            if serving is not None:
                ctx.set(dut.m_rdata, serving[1] << 8 | beat)
                ctx.set(dut.m_rlast, beat == serving[2])
            ar_fire = ctx.get(dut.m_arvalid) and ctx.get(dut.m_arready)
            r_fire = serving is not None and ctx.get(dut.m_rready)
            for r, port in enumerate((dut.r0, dut.r1)):
                if ctx.get(port.valid) and ctx.get(port.ready):
                    got[r].append(ctx.get(port.payload))
            if ar_fire:
                r = int(ctx.get(dut.ar1.ready))
                tag, n = pending[r].pop(0)
                accepted.append((r, tag, n))
            if r_fire:
                beat += 1
                if beat > serving[2]:
                    accepted.pop(0)
                    beat = 0
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    for r in (0, 1):
        assert got[r] == [tag << 8 | b for tag, n in reqs[r] for b in range(n + 1)]


SPAD_CLIENTS = [
    Client("ra", "A", False),
    Client("rb", "A", False),
    Client("rw", "A", False, lanes=2),
    Client("wd", "B", True, lanes=2),
    Client("rs", "B", False, lanes=2),
    Client("wl", "B", True),
]


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_banked_scratchpad_grants_and_data_match_a_reference(seed):
    """Random traffic from readers and writers on both ports: grants follow priority, all-or-nothing
    per client and one access per bank and port; reads return the words as they were before the
    cycle's writes, one cycle after the grant; writes land with their byte enables."""
    L, P = 4, 5
    dut = BankedScratchpad(2 * 64 * L, L, P, SPAD_CLIENTS)
    rng = random.Random(seed)
    ref = bytearray(rng.randbytes(dut.size))
    granted_total = 0

    async def bench(ctx):
        nonlocal granted_total
        # fill the memory through the write clients so the reference and the banks agree
        for g in range(0, dut.words, 2):
            ctx.set(dut.wd.addr, g)
            ctx.set(dut.wd.data, int.from_bytes(ref[g * L : (g + 2) * L], "little"))
            ctx.set(dut.wd.be, (1 << 2 * L) - 1)
            ctx.set(dut.wd.en, 1)
            await ctx.tick()
        ctx.set(dut.wd.en, 0)
        expect = {}  # reader -> bytes due this cycle
        for _ in range(300):
            reqs = {}
            for c in SPAD_CLIENTS:
                en = rng.random() < 0.6
                g = rng.randrange(0, dut.words, c.lanes)  # bus-word clients are aligned
                ctx.set(getattr(dut, c.name).en, en)
                ctx.set(getattr(dut, c.name).addr, g)
                if c.write:
                    data = rng.randbytes(L * c.lanes)
                    be = rng.getrandbits(L * c.lanes)
                    ctx.set(getattr(dut, c.name).data, int.from_bytes(data, "little"))
                    ctx.set(getattr(dut, c.name).be, be)
                reqs[c.name] = (en, g, data if c.write else None, be if c.write else None)
            # data of last cycle's grants
            for name, want in expect.items():
                assert ctx.get(getattr(dut, name).data).to_bytes(len(want), "little") == want, name
            expect = {}
            # the reference arbiter
            taken = {"A": set(), "B": set()}
            writes = []
            for c in SPAD_CLIENTS:
                en, g, data, be = reqs[c.name]
                need = {dut.bank_of(g + k)[0] for k in range(c.lanes)}
                want = en and not (need & taken[c.port])
                assert ctx.get(getattr(dut, c.name).grant) == want, c.name
                if want:
                    granted_total += 1
                    taken[c.port] |= need
                    if c.write:
                        writes.append((g, data, be))
                    else:
                        expect[c.name] = bytes(ref[g * L : (g + c.lanes) * L])
            for g, data, be in writes:
                for i in range(len(data)):
                    if be >> i & 1:
                        ref[g * L + i] = data[i]
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert granted_total > 300
