"""Dispatch-time instruction checks in hardware: the same rules, in the same order, as
`npu.isa.validate` (decode errors, token rules, field rules, alignment, address ranges, operand
memories, overlaps). Produces the ErrorCode of the first rule broken, or NONE.
"""

from __future__ import annotations

from amaranth import Const, Module, Mux, Signal

from npu.config import ACC_BASE, NpuConfig
from npu.isa import FORMATS, HEADER_BITS, INSTR_BITS, MAX_SHIFT, ErrorCode, Opcode

from .common import view

E = ErrorCode


def _extent(base, rows, width, stride):
    """(nonempty, start, end) of `rows` rows of `width` bytes `stride` apart."""
    nonempty = (rows != 0) & (width != 0)
    end = base + (rows - 1) * stride + width
    return nonempty, base, end


def check_instruction(m: Module, word, cfg: NpuConfig) -> Signal:
    """An ErrorCode signal for the 256-bit instruction `word` on configuration `cfg`."""
    code = Signal(8)
    opv = word[:4]
    wait = word[4:8]
    signal = word[8:12]

    # each rule: (condition, code), checked in order
    for op in Opcode:
        fields = FORMATS[op]
        used = HEADER_BITS + sum(f.width for f in fields)
        rules: list[tuple[object, ErrorCode]] = []
        f = view(op, word)
        rules.append((word[12:16] != 0, E.ILLEGAL_FIELD))
        for fd in fields:
            if fd.kind == "enum" and (1 << fd.width) > len(fd.choices):
                rules.append((getattr(f, fd.name).as_value() >= len(fd.choices), E.ILLEGAL_FIELD))
        if used < INSTR_BITS:
            rules.append((word[used:] != 0, E.ILLEGAL_FIELD))
        # tokens
        if op in (Opcode.END, Opcode.BARRIER, Opcode.FENCE, Opcode.CANCEL_POINT):
            rules.append(((wait | signal) != 0, E.ILLEGAL_FIELD))
        else:
            if op == Opcode.SYNC:
                unit_bit = Const(1, 4) << f.unit
            else:
                from npu.isa import UNIT_OF

                unit_bit = Const(1 << int(UNIT_OF[op]), 4)
            rules.append((((wait | signal) & unit_bit) != 0, E.ILLEGAL_FIELD))
        names = {fd.name for fd in fields}
        if "shift" in names:
            rules.append((f.shift > MAX_SHIFT, E.ILLEGAL_FIELD))
        if "lo" in names:
            rules.append((f.lo > f.hi, E.ILLEGAL_FIELD))
        if op == Opcode.VMAP:
            rules.append((f.src_type & (f.zp_in != 0), E.ILLEGAL_FIELD))
        if op == Opcode.POOL:
            live = (f.channels != 0) & (f.out_h != 0) & (f.out_w != 0)
            zero = (f.kh == 0) | (f.kw == 0) | (f.sh == 0) | (f.sw == 0)
            rules.append((live & zero, E.ILLEGAL_FIELD))
            rules.append((live & ((f.out_w - 1) * f.sw + f.kw > f.in_w), E.ILLEGAL_FIELD))
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
        # address ranges, in footprint order (reads then writes)
        spans = _spans(op, f)  # list of (space, nonempty, start, end, required-memory or None)
        for space, ne, start, end, _req in spans:
            if space == "dram":
                rules.append((ne & (end > cfg.dram_bytes), E.DRAM_RANGE))
            else:
                rules.append((ne & ~_in_spad(start, end, cfg) & ~_in_acc(start, end, cfg), E.SPAD_RANGE))
        for _space, ne, start, end, req in _required(op, f):
            inside = _in_acc(start, end, cfg) if req == "acc" else _in_spad(start, end, cfg)
            rules.append((ne & ~inside, E.SPAD_RANGE))
        for cond in _overlaps(op, f):
            rules.append((cond, E.ILLEGAL_FIELD))
        # first rule that fires
        op_code = Const(0, 8)
        for cond, c in reversed(rules):
            op_code = Mux(cond, int(c), op_code)
        with m.If(opv == int(op)):
            m.d.comb += code.eq(op_code)
    known = Const(0, 1)
    for op in Opcode:
        known = known | (opv == int(op))
    with m.If(~known):
        m.d.comb += code.eq(int(E.ILLEGAL_OPCODE))
    return code


def _in_spad(start, end, cfg):
    return end <= cfg.spad_bytes


def _in_acc(start, end, cfg):
    return (start >= ACC_BASE) & (end <= ACC_BASE + cfg.acc_bytes)


def _spans(op, f):
    """Footprint spans in the order npu.isa.footprint lists them (reads, then writes)."""
    if op == Opcode.LOAD:
        tr = f.pad_top + f.rows + f.pad_bottom
        tw = f.pad_left + f.cols + f.pad_right
        return [
            ("dram", *_extent(f.dram, f.rows, f.cols, f.dram_stride), None),
            ("onchip", *_extent(f.spad, tr, tw, f.spad_stride), None),
        ]
    if op == Opcode.STORE:
        return [
            ("onchip", *_extent(f.spad, f.rows, f.cols, f.spad_stride), None),
            ("dram", *_extent(f.dram, f.rows, f.cols, f.dram_stride), None),
        ]
    if op == Opcode.MATMUL:
        kz = f.k != 0
        a = _extent(f.a, f.m, f.k, f.a_stride)
        b = _extent(f.b, f.n, f.k, f.b_stride)
        c = _extent(f.c, f.m, 4 * f.n, f.c_stride)
        out = [("onchip", a[0] & kz, a[1], a[2], None), ("onchip", b[0] & kz, b[1], b[2], None)]
        out.append(("onchip", c[0] & f.accumulate, c[1], c[2], None))
        out.append(("onchip", *c, None))
        return out
    if op == Opcode.VMAP:
        w = Mux(f.src_type, 4 * f.cols, f.cols)
        return [
            ("onchip", *_extent(f.src, f.rows, w, f.src_stride), None),
            ("onchip", *_extent(f.dst, f.rows, f.cols, f.dst_stride), None),
        ]
    if op == Opcode.VADD:
        ne = f.len != 0
        return [
            ("onchip", ne, f.a, f.a + f.len, None),
            ("onchip", ne, f.b, f.b + f.len, None),
            ("onchip", ne, f.dst, f.dst + f.len, None),
        ]
    if op == Opcode.POOL:
        live = (f.channels != 0) & (f.out_h != 0) & (f.out_w != 0)
        in_rows = (f.out_h - 1) * f.sh + f.kh
        rd_end = f.src + in_rows * f.in_w * f.channels
        wr_end = f.dst + f.out_h * f.out_w * f.channels
        return [
            ("onchip", live & (rd_end > f.src), f.src, rd_end, None),
            ("onchip", live & (wr_end > f.dst), f.dst, wr_end, None),
        ]
    return []


def _required(op, f):
    if op == Opcode.MATMUL:
        a = _extent(f.a, f.m, f.k, f.a_stride)
        b = _extent(f.b, f.n, f.k, f.b_stride)
        c = _extent(f.c, f.m, 4 * f.n, f.c_stride)
        return [
            ("onchip", a[0] & (f.k != 0), a[1], a[2], "spad"),
            ("onchip", b[0] & (f.k != 0), b[1], b[2], "spad"),
            ("onchip", *c, "acc"),
        ]
    if op == Opcode.VMAP:
        w = Mux(f.src_type, 4 * f.cols, f.cols)
        s = _extent(f.src, f.rows, w, f.src_stride)
        d = _extent(f.dst, f.rows, f.cols, f.dst_stride)
        # the source memory depends on src_type: check both variants under their condition
        return [
            ("onchip", s[0] & f.src_type, s[1], s[2], "acc"),
            ("onchip", s[0] & ~f.src_type, s[1], s[2], "spad"),
            ("onchip", *d, "spad"),
        ]
    if op in (Opcode.VADD, Opcode.POOL):
        return [(sp, ne, st, en, "spad") for sp, ne, st, en, _ in _spans(op, f)]
    return []


def _overlaps(op, f):
    def ov(a, b):
        (ane, a0, a1), (bne, b0, b1) = a, b
        return ane & bne & (a0 < b1) & (b0 < a1)

    if op == Opcode.VMAP:
        same = (f.src == f.dst) & (f.src_stride == f.dst_stride)
        s = _extent(f.src, f.rows, f.cols, f.src_stride)
        d = _extent(f.dst, f.rows, f.cols, f.dst_stride)
        return [~f.src_type & ~same & ov(s, d)]
    if op == Opcode.VADD:
        ne = f.len != 0
        d = (ne, f.dst, f.dst + f.len)
        return [
            (f.a != f.dst) & ov((ne, f.a, f.a + f.len), d),
            (f.b != f.dst) & ov((ne, f.b, f.b + f.len), d),
        ]
    if op == Opcode.POOL:
        (_, rne, r0, r1, _), (_, wne, w0, w1, _) = _spans(op, f)
        return [ov((rne, r0, r1), (wne, w0, w1))]
    return []
