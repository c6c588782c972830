"""Instruction checks in hardware: the same rules, in the same order, as `npu.isa.validate` (decode
errors, token rules, field rules, alignment, address ranges, operand memories, overlaps), giving the
ErrorCode of the first rule broken, or NONE.

The checks run as a pipeline of `CHECK_LATENCY` register stages in the fetcher, before an
instruction enters its buffer, so no stage holds more than one multiplier, one sum or one compare
(the combinational version capped the core's clock near 10 MHz on an ECP5):

  0. the instruction word is registered;
  1. first-level products (a row count times a stride, ...), shared by all opcodes: one multiplier
     per slot, its operands chosen by the opcode (and registered in stage 0);
  2. the second-level products (POOL's input and output footprints, C * W * rows), one multiplier
     each;
  3. the products as the sums take them. Each is exact below 2^bits, where bits covers the largest
     on-chip memory (DRAM for LOAD's and STORE's DRAM product): a product at or above that, of
     nonzero factors, takes its footprint past every memory whatever its exact value, so the range
     rule of that footprint fires, before any later rule reads its end, and the product saturates
     to SATURATED instead. A footprint that is empty is read by no rule. Cut so, a product fits one
     or two MULT18X18D where 32-bit factors took up to four (docs/boards.md);
  4. the footprints' ends (start + product + width; an int16 operand's width in bytes is its
     count shifted left by its `*_i16` flag, so element sizes cost no multiplier);
  5. every rule's condition (compares), selected for the word's opcode; last, LOAD's and STORE's
     DRAM range against the memory window (PROTECTION);
  6. the first rule that fires (a priority tree) gives the code.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.config import ACC_BASE, NpuConfig
from npu.isa import (
    FORMATS,
    HEADER_BITS,
    INSTR_BITS,
    LUT_BYTES,
    MAX_SHIFT,
    PER_COL_MAX,
    UNIT_OF,
    VECTOR_OPERANDS,
    ErrorCode,
    Opcode,
)

from .common import log2, view

E = ErrorCode
CHECK_LATENCY = 7  # cycles from `word` to `code`
L1_SLOTS = 4
L2_SLOTS = 3
SUM_SLOTS = 4
#: a product too big for any rule to pass: past DRAM, the scratchpad and the accumulators
SATURATED = 1 << 40


def product_bits(cfg: NpuConfig) -> tuple[int, int]:
    """(on-chip, DRAM) bits a product must be exact in: a larger one makes its footprint reach past
    every on-chip memory (or past DRAM), so a range rule fires whatever its exact value."""
    return max(cfg.spad_bytes, cfg.acc_bytes).bit_length(), cfg.dram_bytes.bit_length()


def _level1(op, f) -> list[tuple]:
    """First-level products of `op`: (a, b) pairs, at most L1_SLOTS."""
    if op == Opcode.LOAD:
        tr = f.pad_top + f.rows + f.pad_bottom
        return [(f.rows - 1, f.dram_stride), (tr - 1, f.spad_stride)]
    if op == Opcode.STORE:  # the DRAM product in slot 0, the only one wide enough
        return [(f.rows - 1, f.dram_stride), (f.rows - 1, f.spad_stride)]
    if op == Opcode.MATMUL:
        return [(f.m - 1, f.a_stride), (f.n - 1, f.b_stride), (f.m - 1, f.c_stride)]
    if op in (Opcode.VMAP, Opcode.VLUT):
        return [(f.rows - 1, f.src_stride), (f.rows - 1, f.dst_stride)]
    if op == Opcode.VMUL:
        return [(f.rows - 1, f.a_stride), (f.rows - 1, f.b_stride), (f.rows - 1, f.dst_stride)]
    if op == Opcode.POOL:
        # in_w times the bytes of an input pixel (C elements of 1 or 2 bytes)
        return [
            (f.out_w - 1, f.sw),
            (f.out_h - 1, f.sh),
            (f.in_w, f.channels << f.src_i16),
            (f.out_h, f.out_w),
        ]
    return []


def _level2(op, f, p1, big1) -> list:
    """Second-level products (of first-level ones), at most L2_SLOTS: (a, a too big, b, b too big)
    each, a first-level product being too big when it saturated."""
    if op == Opcode.POOL:
        # the input rows ((out_h - 1) * sh + kh) times the row bytes, as two products the next stage
        # adds; the output pixels times the bytes of an output pixel
        c_out = f.channels << f.dst_i16
        return [p1[1], big1[1], p1[2], big1[2], p1[3], big1[3], c_out, 0, f.kh, 0, p1[2], big1[2]]
    return []


def _bytes(count, i16):
    """Bytes of `count` elements, int16 when the 1-bit flag `i16` is set (a shift, no multiplier)."""
    return count << i16


def _src_width(f):
    """VMAP: bytes of a source row (int32 accumulators, int16 or int8 scratchpad elements)."""
    return Mux(f.src_type, 4 * f.cols, _bytes(f.cols, f.src_i16))


def _sums(op, f, p1, p2) -> list:
    """The ends of `op`'s footprints (start + (rows - 1) * stride + width, widths in bytes of the
    operands' element sizes) and POOL's window reach, at most SUM_SLOTS: added in a stage of their
    own, compared in the next."""
    if op == Opcode.LOAD:
        tw = f.pad_left + f.cols + f.pad_right
        return [f.dram + p1[0] + f.cols, f.spad + p1[1] + tw]
    if op == Opcode.STORE:
        return [f.spad + p1[1] + f.cols, f.dram + p1[0] + f.cols]
    if op == Opcode.MATMUL:
        return [f.a + p1[0] + _bytes(f.k, f.a_i16), f.b + p1[1] + f.k, f.c + p1[2] + 4 * f.n]
    if op == Opcode.VMAP:
        return [
            f.src + p1[0] + _src_width(f),
            f.dst + p1[1] + _bytes(f.cols, f.dst_i16),
            f.mults + 4 * f.cols,
        ]
    if op == Opcode.VLUT:
        return [f.src + p1[0] + f.cols, f.dst + p1[1] + f.cols, f.table + LUT_BYTES]
    if op == Opcode.VMUL:
        return [f.a + p1[0] + _bytes(f.cols, f.a_i16), f.b + p1[1] + _bytes(f.cols, f.b_i16),
                f.dst + p1[2] + _bytes(f.cols, f.dst_i16)]  # fmt: skip
    if op == Opcode.VADD:
        return [f.a + _bytes(f.len, f.a_i16), f.b + _bytes(f.len, f.b_i16), f.dst + _bytes(f.len, f.dst_i16)]
    if op == Opcode.POOL:
        # src + in_rows * W * C, dst + out_h * out_w * C, (out_w - 1) * sw + kw
        return [f.src + p2[0] + p2[2], f.dst + p2[1], p1[0] + f.kw]
    return []


def _extent(base, rows, width, end):
    """(nonempty, start, end) of `rows` rows of `width` bytes ending (exclusive) at `end`."""
    nonempty = (rows != 0) & (width != 0)
    return nonempty, base, end


def _in_spad(start, end, cfg):
    return end <= cfg.spad_bytes


def _in_acc(start, end, cfg):
    return (start >= ACC_BASE) & (end <= ACC_BASE + cfg.acc_bytes)


def _spans(op, f, e):
    """Footprint spans in the order npu.isa.footprint lists them (reads, then writes)."""
    if op == Opcode.LOAD:
        tr = f.pad_top + f.rows + f.pad_bottom
        tw = f.pad_left + f.cols + f.pad_right
        return [
            ("dram", *_extent(f.dram, f.rows, f.cols, e[0])),
            ("onchip", *_extent(f.spad, tr, tw, e[1])),
        ]
    if op == Opcode.STORE:
        return [
            ("onchip", *_extent(f.spad, f.rows, f.cols, e[0])),
            ("dram", *_extent(f.dram, f.rows, f.cols, e[1])),
        ]
    if op == Opcode.MATMUL:
        kz = f.k != 0
        a = _extent(f.a, f.m, f.k, e[0])  # 2k bytes with int16 A: nonempty alike
        b = _extent(f.b, f.n, f.k, e[1])
        c = _extent(f.c, f.m, 4 * f.n, e[2])
        return [("onchip", a[0] & kz, a[1], a[2]), ("onchip", b[0] & kz, b[1], b[2]),
                ("onchip", c[0] & f.accumulate, c[1], c[2]), ("onchip", *c)]  # fmt: skip
    if op == Opcode.VMAP:
        pc = f.per_col & (f.rows != 0) & (f.cols != 0)
        return [
            ("onchip", *_extent(f.src, f.rows, f.cols, e[0])),
            ("onchip", pc, f.mults, e[2]),
            ("onchip", pc, f.shifts, f.shifts + f.cols),
            ("onchip", *_extent(f.dst, f.rows, f.cols, e[1])),
        ]
    if op == Opcode.VLUT:
        live = (f.rows != 0) & (f.cols != 0)
        return [("onchip", live, f.src, e[0]), ("onchip", live, f.table, e[2]), ("onchip", live, f.dst, e[1])]
    if op == Opcode.VMUL:
        live = (f.rows != 0) & (f.cols != 0)
        return [("onchip", live, f.a, e[0]), ("onchip", live, f.b, e[1]), ("onchip", live, f.dst, e[2])]
    if op == Opcode.VADD:
        ne = f.len != 0
        return [("onchip", ne, f.a, e[0]), ("onchip", ne, f.b, e[1]), ("onchip", ne, f.dst, e[2])]
    if op == Opcode.POOL:
        live = (f.channels != 0) & (f.out_h != 0) & (f.out_w != 0)
        rd_end, wr_end = e[0], e[1]
        return [
            ("onchip", live & (rd_end > f.src), f.src, rd_end),
            ("onchip", live & (wr_end > f.dst), f.dst, wr_end),
        ]
    return []


def _required(op, f, e):
    """(nonempty, start, end, memory) of operands that must lie in one memory ("spad" or "acc")."""
    if op == Opcode.MATMUL:
        a, b, _, c = _spans(op, f, e)
        return [(a[1], a[2], a[3], "spad"), (b[1], b[2], b[3], "spad"), (c[1], c[2], c[3], "acc")]
    if op == Opcode.VMAP:
        s = _extent(f.src, f.rows, f.cols, e[0])
        d = _extent(f.dst, f.rows, f.cols, e[1])
        # the source memory depends on src_type: check both variants under their condition
        pc = f.per_col & (f.rows != 0) & (f.cols != 0)
        return [
            (s[0] & f.src_type, s[1], s[2], "acc"),
            (s[0] & ~f.src_type, s[1], s[2], "spad"),
            (*d, "spad"),
            (pc, f.mults, e[2], "spad"),
            (pc, f.shifts, f.shifts + f.cols, "spad"),
        ]
    if op in (Opcode.VADD, Opcode.POOL, Opcode.VLUT, Opcode.VMUL):
        return [(ne, st, en, "spad") for _, ne, st, en in _spans(op, f, e)]
    return []


def _overlaps(op, f, e):
    def ov(a, b):
        (ane, a0, a1), (bne, b0, b1) = a, b
        return ane & bne & (a0 < b1) & (b0 < a1)

    # an operand may be its destination in place only with the same element type
    if op == Opcode.VMAP:
        same = (f.src == f.dst) & (f.src_stride == f.dst_stride) & (f.src_i16 == f.dst_i16)
        s = _extent(f.src, f.rows, f.cols, e[0])  # an int8 or int16 source (src_type=0)
        d = _extent(f.dst, f.rows, f.cols, e[1])
        return [~f.src_type & ~same & ov(s, d)]
    if op == Opcode.VLUT:
        same = (f.src == f.dst) & (f.src_stride == f.dst_stride)
        live = (f.rows != 0) & (f.cols != 0)
        return [~same & ov((live, f.src, e[0]), (live, f.dst, e[1]))]
    if op == Opcode.VMUL:
        live = (f.rows != 0) & (f.cols != 0)
        d = (live, f.dst, e[2])
        return [
            ~((f.a == f.dst) & (f.a_stride == f.dst_stride) & (f.a_i16 == f.dst_i16))
            & ov((live, f.a, e[0]), d),
            ~((f.b == f.dst) & (f.b_stride == f.dst_stride) & (f.b_i16 == f.dst_i16))
            & ov((live, f.b, e[1]), d),
        ]
    if op == Opcode.VADD:
        ne = f.len != 0
        d = (ne, f.dst, e[2])
        return [
            ~((f.a == f.dst) & (f.a_i16 == f.dst_i16)) & ov((ne, f.a, e[0]), d),
            ~((f.b == f.dst) & (f.b_i16 == f.dst_i16)) & ov((ne, f.b, e[1]), d),
        ]
    if op == Opcode.POOL:
        (_, rne, r0, r1), (_, wne, w0, w1) = _spans(op, f, e)
        return [ov((rne, r0, r1), (wne, w0, w1))]
    return []


def _wide_rules(op, f, cfg: NpuConfig) -> list:
    """`npu.isa.wide_operands` as conditions: an operand whose step takes two words (its type's
    element bytes x vector_lanes exceed the word, and it has more than a word of elements) at an
    address or row pitch that is not word-aligned. Only the types whose steps can take two words on
    this configuration get logic (none on the boards' presets)."""
    ops = VECTOR_OPERANDS.get(op)
    if ops is None or cfg.core == "micro":
        return []
    out = []
    for name, stride, count in ops:
        if op == Opcode.VMAP and name == "src":
            kinds = [(~f.src_type & ~f.src_i16, 1, cfg.lanes), (~f.src_type & f.src_i16, 2, cfg.lanes),
                     (f.src_type, 4, cfg.bus_bytes)]  # fmt: skip
        else:
            i16 = getattr(f, f"{name}_i16")
            kinds = [(~i16, 1, cfg.lanes), (i16, 2, cfg.lanes)]
        for is_kind, e, word in kinds:
            if e * cfg.vector_lanes <= word:
                continue
            bits = log2(word)
            bad = getattr(f, name)[:bits] != 0
            if op == Opcode.POOL:
                bad |= f.channels[: log2(word // e)] != 0
            elif stride is not None:
                bad |= (f.rows > 1) & (getattr(f, stride)[:bits] != 0)
            out.append(is_kind & (getattr(f, count) > word // e) & bad)
    return out


def _rules(op, word, f, e, cfg: NpuConfig, win=None) -> list[tuple[object, ErrorCode]]:
    """(condition, code) of every rule of `op`, in the order `npu.isa.validate` applies them, then
    the memory window [win[0], win[1]) of a LOAD's or STORE's DRAM range (PROTECTION)."""
    wait, signal = word[4:8], word[8:12]
    fields = FORMATS[op]
    used = HEADER_BITS + sum(fd.width for fd in fields)
    rules: list[tuple[object, ErrorCode]] = [(word[12:16] != 0, E.ILLEGAL_FIELD)]
    for fd in fields:
        if fd.kind == "enum" and (1 << fd.width) > len(fd.choices):
            rules.append((getattr(f, fd.name).as_value() >= len(fd.choices), E.ILLEGAL_FIELD))
    if used < INSTR_BITS:
        rules.append((word[used:] != 0, E.ILLEGAL_FIELD))
    # tokens
    if op in (Opcode.END, Opcode.BARRIER, Opcode.FENCE, Opcode.CANCEL_POINT):
        rules.append(((wait | signal) != 0, E.ILLEGAL_FIELD))
    else:
        unit_bit = Const(1, 4) << f.unit if op == Opcode.SYNC else Const(1 << int(UNIT_OF[op]), 4)
        rules.append((((wait | signal) & unit_bit) != 0, E.ILLEGAL_FIELD))
    names = {fd.name for fd in fields}
    if "shift" in names:
        rules.append((f.shift > MAX_SHIFT, E.ILLEGAL_FIELD))
    if "lo" in names:
        rules.append((f.lo > f.hi, E.ILLEGAL_FIELD))
    if op == Opcode.VMAP:
        rules.append((f.src_type & (f.zp_in != 0), E.ILLEGAL_FIELD))
        rules.append((f.src_type & f.src_i16, E.ILLEGAL_FIELD))
    if op == Opcode.LOAD:
        rules.append((f.pad_i16 & (f.pad_left[0] | f.pad_right[0]), E.ILLEGAL_FIELD))
    if op == Opcode.VMAP:
        rules.append((f.per_col & (f.cols > PER_COL_MAX), E.ILLEGAL_FIELD))
    if op == Opcode.POOL:
        live = (f.channels != 0) & (f.out_h != 0) & (f.out_w != 0)
        zero = (f.kh == 0) | (f.kw == 0) | (f.sh == 0) | (f.sw == 0)
        rules.append((live & zero, E.ILLEGAL_FIELD))
        rules.append((live & (e[2] > f.in_w), E.ILLEGAL_FIELD))  # (out_w - 1) * sw + kw > in_w
    if op == Opcode.LOAD:
        tw = f.pad_left + f.cols + f.pad_right
        tr = f.pad_top + f.rows + f.pad_bottom
        rules.append(((f.spad_stride < tw) & (tr > 1), E.ILLEGAL_FIELD))
    # alignment
    if op == Opcode.MATMUL:
        for name in ("a", "a_stride", "b", "b_stride"):
            rules.append((getattr(f, name) % cfg.lanes != 0, E.MISALIGNED))
        for name in ("c", "c_stride"):
            rules.append((getattr(f, name) % cfg.acc_row_bytes != 0, E.MISALIGNED))
    if op == Opcode.VMAP:
        for name in ("src", "src_stride"):
            rules.append((f.src_type & (getattr(f, name)[:2] != 0), E.MISALIGNED))
    rules += [(cond, E.MISALIGNED) for cond in _wide_rules(op, f, cfg)]
    # address ranges, in footprint order (reads then writes)
    for space, ne, start, end in _spans(op, f, e):
        if space == "dram":
            rules.append((ne & (end > cfg.dram_bytes), E.DRAM_RANGE))
        else:
            rules.append((ne & ~_in_spad(start, end, cfg) & ~_in_acc(start, end, cfg), E.SPAD_RANGE))
    for ne, start, end, req in _required(op, f, e):
        inside = _in_acc(start, end, cfg) if req == "acc" else _in_spad(start, end, cfg)
        rules.append((ne & ~inside, E.SPAD_RANGE))
    for cond in _overlaps(op, f, e):
        rules.append((cond, E.ILLEGAL_FIELD))
    if win is not None:
        # 33 bits of the end suffice: an end at or above 2^33 is past DRAM, which DRAM_RANGE (earlier
        # in the order) reports; a short compare keeps the stage's path short (Fmax)
        for space, ne, start, end in _spans(op, f, e):
            if space == "dram":
                rules.append((ne & ((start < win[0]) | (end[:33] > win[1])), E.PROTECTION))
    return rules


def _per_opcode(m: Module, domain: str, word, slots: list, values) -> None:
    """Drive `slots` (in order) from `values(op, view)` for the opcode of `word`; an opcode with
    fewer values leaves the rest alone (0 in the comb domain)."""
    with m.Switch(word[:4]):
        for op in Opcode:
            with m.Case(op):
                vals = values(op, view(op, word))
                assert len(vals) <= len(slots), (op, len(vals), len(slots))
                m.d[domain] += [slot.eq(v) for slot, v in zip(slots[: len(vals)], vals, strict=True)]


def _first(bits: list, codes: list):
    """(any, code) of the first set bit: a balanced tree, log2(len) multiplexers deep."""
    if len(bits) == 1:
        return bits[0], codes[0]
    h = len(bits) // 2
    la, lc = _first(bits[:h], codes[:h])
    ra, rc = _first(bits[h:], codes[h:])
    return la | ra, Mux(la, lc, rc)


class InstructionCheck(wiring.Component):
    """`word` (with `valid` and an `extra` payload carried alongside) comes out CHECK_LATENCY cycles
    later as `out_word`/`out_extra`/`out_valid` with its ErrorCode `code`. No back-pressure: every
    stage moves each cycle. `flush` drops every instruction inside."""

    def __init__(self, cfg: NpuConfig, extra: int = 1):
        self.cfg = cfg
        super().__init__(
            {
                "word": In(INSTR_BITS),
                "extra": In(extra),
                "valid": In(1),
                "flush": In(1),
                "out_word": Out(INSTR_BITS),
                "out_extra": Out(extra),
                "out_valid": Out(1),
                "code": Out(ErrorCode),
                # the memory window [win_base, win_hi) of LOAD and STORE (reset: none)
                "win_base": In(32),
                "win_hi": In(33, init=1 << 32),
            }
        )

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        n = CHECK_LATENCY
        words = [Signal(INSTR_BITS, name=f"word{s}") for s in range(n)]
        extras = [Signal(len(self.extra), name=f"extra{s}") for s in range(n)]
        valids = [Signal(name=f"valid{s}") for s in range(n)]
        m.d.sync += [words[0].eq(self.word), extras[0].eq(self.extra), valids[0].eq(self.valid)]
        for s in range(1, n):
            m.d.sync += [words[s].eq(words[s - 1]), extras[s].eq(extras[s - 1]), valids[s].eq(valids[s - 1])]
        with m.If(self.flush):
            m.d.sync += [v.eq(0) for v in valids]
        m.d.comb += [
            self.out_word.eq(words[-1]),
            self.out_extra.eq(extras[-1]),
            self.out_valid.eq(valids[-1]),
        ]

        # stage 1: first-level products of the word in stage 0. Their operands (counts minus one,
        # padded rows: adders, chosen by the opcode) are registered with the word in stage 0, so a
        # multiplier is all that stage 1 holds (Fmax). In the fetcher, only POOL's src_i16 of the
        # operands' fields arrives with the word's last beat; the rest come from its beat-assembly
        # register. A product is exact below 2^bits (each rule needs no more, module docstring) and
        # marked too big above, where an 18 x 18 multiplier or two would otherwise need four.
        on, dram = product_bits(cfg)
        bits1 = [max(on, dram), on, on, on]  # slot 0 holds LOAD's and STORE's DRAM product
        ops1 = [(Signal(signed(18), name=f"p1a_{k}"), Signal(32, name=f"p1b_{k}")) for k in range(L1_SLOTS)]
        m.d.sync += [x.eq(0) for ab in ops1 for x in ab]
        _per_opcode(m, "sync", self.word, [x for ab in ops1 for x in ab],
                    lambda op, f: [x for ab in _level1(op, f) for x in ab])  # fmt: skip
        p1 = [Signal(signed(20 + w), name=f"p1_{k}") for k, w in enumerate(bits1)]
        big1 = [Signal(name=f"big1_{k}") for k in range(L1_SLOTS)]
        for k, ((a, b), w) in enumerate(zip(ops1, bits1, strict=True)):
            m.d.sync += [p1[k].eq(a * b[:w]), big1[k].eq((b[w:] != 0) & (a > 0))]
        # stage 2: second-level products (of stage 1's word), of operands cut to `on` bits: one
        # multiplier each, marked too big where an operand is (and the other is not zero)
        ops2 = [Signal(64, name=f"p2op_{k}") if k % 2 == 0 else Signal(name=f"p2big_{k}")
                for k in range(4 * L2_SLOTS)]  # fmt: skip
        _per_opcode(m, "comb", words[1], ops2, lambda op, f: _level2(op, f, p1, big1))
        pp = [Signal(unsigned(2 * on), name=f"pp_{k}") for k in range(L2_SLOTS)]
        big2 = [Signal(name=f"big2_{k}") for k in range(L2_SLOTS)]
        for k in range(L2_SLOTS):
            a, a_big, b, b_big = ops2[4 * k : 4 * k + 4]
            a_big, b_big = a_big | (a[on:] != 0), b_big | (b[on:] != 0)
            m.d.sync += [pp[k].eq(a[:on] * b[:on]),
                         big2[k].eq((a_big & (b_big | (b != 0))) | (b_big & (a != 0)))]  # fmt: skip
        # stage 3: the products as the sums take them, a too-big one as SATURATED
        p1_2 = [Signal.like(p, name=f"p1_2_{k}") for k, p in enumerate(p1)]
        big1_2 = [Signal(name=f"big1_2_{k}") for k in range(L1_SLOTS)]
        m.d.sync += [q.eq(p) for q, p in zip([*p1_2, *big1_2], [*p1, *big1], strict=True)]
        p1_3 = [Signal(signed(64), name=f"p1_3_{k}") for k in range(L1_SLOTS)]
        p2 = [Signal(signed(64), name=f"p2_{k}") for k in range(L2_SLOTS)]
        m.d.sync += [q.eq(Mux(b, SATURATED, p)) for q, p, b in zip(p1_3, p1_2, big1_2, strict=True)]
        m.d.sync += [q.eq(Mux(b, SATURATED, p)) for q, p, b in zip(p2, pp, big2, strict=True)]
        # stage 4: the footprints' ends (of stage 3's word)
        ends = [Signal(signed(68), name=f"end{k}") for k in range(SUM_SLOTS)]
        _per_opcode(m, "sync", words[3], ends, lambda op, f: _sums(op, f, p1_3, p2))
        # stage 5: the rules of the word in stage 4 (compares), selected by its opcode
        win = (self.win_base, self.win_hi)
        rules = {op: _rules(op, words[4], view(op, words[4]), ends, cfg, win) for op in Opcode}
        codes = {op: [int(c) for _, c in r] for op, r in rules.items()}
        width = max(len(r) for r in rules.values())
        fired = Signal(width)
        known = Signal()
        with m.Switch(words[4][:4]):
            for op in Opcode:
                with m.Case(op):
                    m.d.sync += [fired.eq(Cat(*[Value.cast(c).bool() for c, _ in rules[op]])), known.eq(1)]
            with m.Default():
                m.d.sync += [fired.eq(0), known.eq(0)]
        # stage 6: the first rule that fired (codes per position, chosen by the opcode)
        op4 = words[5][:4]
        pos_codes = []
        for i in range(width):
            c = Const(0, 8)
            for op, cs in codes.items():
                if i < len(cs):
                    c = Mux(op4 == int(op), cs[i], c)
            pos_codes.append(c)
        anyf, first = _first([fired[i] for i in range(width)], pos_codes)
        m.d.sync += self.code.eq(Mux(~known, int(E.ILLEGAL_OPCODE), Mux(anyf, first, 0)))
        return m
