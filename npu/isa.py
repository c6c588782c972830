"""The instruction set: opcodes, field layouts, encoding, decoding and validation.

This module is the single definition used by the assembler, the golden model, the compiler and (as
`amaranth.lib.data` layouts built by :func:`struct_layout`) the hardware decoder. `docs/isa.md` is
its prose description.

Every instruction is 256 bits (32 bytes, little-endian). Bits [0:16) are the header:

    [0:4)   opcode
    [4:8)   wait   -- bit u: pop one token from the channel unit u -> this unit before starting
    [8:12)  signal -- bit u: push one token into the channel this unit -> unit u when done
    [12:16) reserved, zero

then the opcode's fields in the order listed in :data:`FORMATS`, packed from bit 16 upwards; every
bit after the last field is reserved and must be zero.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from amaranth.lib import enum  # Python enums that also give hardware signals their shape

from npu.errors import NpuError

from .config import ACC_BASE, ONCHIP_ADDR_BITS, NpuConfig

INSTR_BITS = 256
INSTR_BYTES = INSTR_BITS // 8
HEADER_BITS = 16
#: Requantisation shifts above this could overflow the 64-bit intermediate.
MAX_SHIFT = 62
#: the most columns a per-column VMAP requantises (the vector unit's parameter memories)
PER_COL_MAX = 256


class Opcode(enum.IntEnum, shape=4):
    END = 0x1
    LOAD = 0x2
    STORE = 0x3
    MATMUL = 0x4
    VMAP = 0x5
    VADD = 0x6
    POOL = 0x7
    CANCEL_POINT = 0x8
    BARRIER = 0x9
    SYNC = 0xA
    FENCE = 0xB
    VLUT = 0xC
    VMUL = 0xD


class Unit(enum.IntEnum, shape=2):
    """Execution units; each has an in-order queue. Token masks are indexed by these values."""

    LOAD = 0
    MATRIX = 1
    VECTOR = 2
    STORE = 3


UNIT_NAMES = {u: u.name.lower() for u in Unit}


class ErrorCode(enum.IntEnum, shape=8):
    """Values of the ERROR_CODE register (see docs/isa.md, "Errors")."""

    NONE = 0
    ILLEGAL_OPCODE = 1
    ILLEGAL_FIELD = 2
    MISALIGNED = 3
    SPAD_RANGE = 4
    DRAM_RANGE = 5
    DEADLOCK = 6
    TOKEN = 7
    TIMEOUT = 8
    BUS = 9
    PROTECTION = 10


class IsaError(NpuError, ValueError):
    """An instruction that breaks an ISA rule; carries the error code the hardware reports."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = ErrorCode(code)


@dataclass(frozen=True)
class Field:
    name: str
    width: int
    signed: bool = False
    default: int = 0
    #: "addr" fields print in hex; "enum" fields print by name from `choices`
    kind: str = "int"
    choices: tuple[str, ...] = ()
    doc: str = ""
    #: printed even when equal to the default (fields that identify the instruction)
    always: bool = False

    @property
    def lo(self) -> int:
        return -(1 << (self.width - 1)) if self.signed else 0

    @property
    def hi(self) -> int:
        return (1 << (self.width - 1)) - 1 if self.signed else (1 << self.width) - 1


A = ONCHIP_ADDR_BITS


def _addr(name: str, doc: str) -> Field:
    return Field(name, A, kind="addr", doc=doc)


def _dram(name: str, doc: str) -> Field:
    return Field(name, 32, kind="addr", doc=doc)


def _requant_fields(zp_in: str = "zp_in") -> list[Field]:
    return [
        Field("mult", 32, signed=True, default=1, doc="int32 multiplier"),
        Field("shift", 6, default=0, doc="rounding right shift, 0..62"),
        Field(zp_in, 8, signed=True, doc="input zero point, subtracted first"),
        Field("zp_out", 8, signed=True, doc="output zero point, added after the shift"),
        Field("lo", 8, signed=True, default=-128, doc="clamp low bound (int8)"),
        Field("hi", 8, signed=True, default=127, doc="clamp high bound (int8)"),
    ]


def _two_operand_requant() -> list[Field]:
    """The rescale of VADD and VMUL after their multipliers: shift, the operands' and the output's
    zero points and the clamp."""
    return [
        Field("shift", 6, default=0, doc="rounding right shift, 0..62"),
        Field("zp_a", 8, signed=True, doc="zero point of a"),
        Field("zp_b", 8, signed=True, doc="zero point of b"),
        Field("zp_out", 8, signed=True, doc="output zero point"),
        Field("lo", 8, signed=True, default=-128, doc="clamp low bound"),
        Field("hi", 8, signed=True, default=127, doc="clamp high bound"),
    ]


def _i16(operand: str, doc: str) -> Field:
    """A flag that makes an operand's elements int16 (docs/isa.md, "int16 activations")."""
    return Field(f"{operand}_i16", 1, doc=doc)


def _i16_operands(*operands: str) -> list[Field]:
    return [_i16(o, f"{o} is int16" + ("; lo and hi bound its high byte" if o == "dst" else ""))
            for o in operands]  # fmt: skip


def elem_bytes(f: dict, operand: str) -> int:
    """Bytes of one element of `operand` ("a", "src", "dst", ...) of a decoded instruction's fields:
    2 when its `<operand>_i16` flag is set, else 1 (int32 accumulator sources are not counted here)."""
    return 2 if f.get(f"{operand}_i16", 0) else 1


def clamp_bounds(f: dict) -> tuple[int, int]:
    """The clamp bounds of a requantising instruction: `lo`, `hi` for an int8 destination; for an
    int16 one they bound its high byte: lo * 256 .. hi * 256 + 255."""
    if f.get("dst_i16", 0):
        return f["lo"] * 256, f["hi"] * 256 + 255
    return f["lo"], f["hi"]


def _rows_fields(*operands: str) -> list[Field]:
    """rows, cols and a row stride per operand: an element-wise instruction's 2-D walk."""
    return [
        Field("rows", 16, doc="rows"),
        Field("cols", 16, doc="elements per row"),
        *(Field(f"{o}_stride", 20, doc=f"bytes between rows of {o}") for o in operands),
    ]


FORMATS: dict[Opcode, tuple[Field, ...]] = {
    Opcode.END: (),
    Opcode.BARRIER: (),
    Opcode.FENCE: (),
    Opcode.CANCEL_POINT: (Field("id", 32, doc="cancellation point id", always=True),),
    Opcode.SYNC: (
        Field("unit", 2, kind="enum", choices=tuple(UNIT_NAMES.values()), doc="queue to run in", always=True),
    ),
    Opcode.LOAD: (
        _addr("spad", "on-chip destination (scratchpad or accumulator bytes)"),
        _dram("dram", "DRAM source address"),
        Field("rows", 16, doc="rows copied from DRAM"),
        Field("cols", 16, doc="bytes per row copied from DRAM"),
        Field("spad_stride", 20, doc="on-chip bytes between padded rows"),
        Field("dram_stride", 32, doc="DRAM bytes between rows"),
        Field("pad_top", 8, doc="rows of pad_value before the data"),
        Field("pad_bottom", 8, doc="rows of pad_value after the data"),
        Field("pad_left", 16, doc="bytes of pad_value before each row"),
        Field("pad_right", 16, doc="bytes of pad_value after each row"),
        Field("pad_value", 8, signed=True, doc="int8 fill value of the padding"),
        _i16("pad", "int16 padding: elements of pad_value * 256 (pad_left, pad_right even)"),
    ),
    Opcode.STORE: (
        _addr("spad", "on-chip source (scratchpad or accumulator bytes)"),
        _dram("dram", "DRAM destination address"),
        Field("rows", 16, doc="rows"),
        Field("cols", 16, doc="bytes per row"),
        Field("spad_stride", 20, doc="on-chip bytes between rows"),
        Field("dram_stride", 32, doc="DRAM bytes between rows"),
    ),
    Opcode.MATMUL: (
        _addr("a", "A: m x k int8, row-major, in the scratchpad"),
        _addr("b", "B transposed: n x k int8, row-major, in the scratchpad"),
        _addr("c", "C: m x n int32, row-major, in the accumulators"),
        Field("m", 16, doc="rows of A and C"),
        Field("n", 16, doc="rows of B^T, columns of C"),
        Field("k", 16, doc="reduction length"),
        Field("a_stride", 20, doc="bytes between rows of A"),
        Field("b_stride", 20, doc="bytes between rows of B^T"),
        Field("c_stride", 20, doc="bytes between rows of C"),
        Field("accumulate", 1, doc="0: C = A.B; 1: C += A.B"),
        _i16("a", "A is int16 (2 bytes an element, little endian)"),
    ),
    Opcode.VMAP: (
        _addr("src", "source: int8 in the scratchpad or int32 in the accumulators"),
        _addr("dst", "destination int8 in the scratchpad"),
        *_rows_fields("src", "dst"),
        Field("src_type", 1, kind="enum", choices=("i8", "i32"), doc="source element type"),
        *_requant_fields(),
        Field("per_col", 1, doc="1: column c uses mults[c] and shifts[c] instead of mult and shift"),
        _addr("mults", "per_col: cols int32 multipliers (little endian) in the scratchpad"),
        _addr("shifts", "per_col: cols rounding shifts (bytes, 0..62) in the scratchpad"),
        _i16("src", "the scratchpad source is int16 (src_type=i8 only)"),
        _i16("dst", "dst is int16; lo and hi bound its high byte"),
    ),
    Opcode.VLUT: (
        _addr("src", "int8 source in the scratchpad"),
        _addr("dst", "int8 destination in the scratchpad"),
        *_rows_fields("src", "dst"),
        _addr("table", "256 int8 outputs in the scratchpad, for inputs -128..127 in order"),
    ),
    Opcode.VMUL: (
        _addr("a", "first int8 operand: rows x cols"),
        _addr("b", "second int8 operand (b_stride 0: one row for every row of a)"),
        _addr("dst", "int8 result"),
        *_rows_fields("a", "b", "dst"),  # b_stride 0: b is one row, broadcast
        Field("mult", 32, signed=True, default=1, doc="int32 multiplier of the product"),
        *_two_operand_requant(),
        *_i16_operands("a", "b", "dst"),
    ),
    Opcode.VADD: (
        _addr("a", "first int8 operand"),
        _addr("b", "second int8 operand"),
        _addr("dst", "int8 result"),
        Field("len", 20, doc="elements"),
        Field("mult_a", 32, signed=True, default=1, doc="int32 multiplier of a"),
        Field("mult_b", 32, signed=True, default=1, doc="int32 multiplier of b"),
        *_two_operand_requant(),
        *_i16_operands("a", "b", "dst"),
    ),
    Opcode.POOL: (
        _addr("src", "input, int8 HWC with row pitch in_w * channels"),
        _addr("dst", "output, int8 HWC, out_h x out_w x channels, contiguous"),
        Field("channels", 16, doc="channels (C)"),
        Field("in_w", 16, doc="input width (W)"),
        Field("out_h", 16, doc="output height"),
        Field("out_w", 16, doc="output width"),
        Field("kh", 8, doc="window height"),
        Field("kw", 8, doc="window width"),
        Field("sh", 8, doc="vertical stride"),
        Field("sw", 8, doc="horizontal stride"),
        Field("mode", 1, kind="enum", choices=("max", "avg"), doc="max or average"),
        *_requant_fields(),
        *_i16_operands("src", "dst"),
    ),
}

MNEMONICS: dict[Opcode, str] = {op: op.name.lower() for op in Opcode}
OPCODE_BY_MNEMONIC = {v: k for k, v in MNEMONICS.items()}

#: The unit each opcode is dispatched to; None for dispatcher-level (control) instructions.
UNIT_OF: dict[Opcode, Unit | None] = {
    Opcode.LOAD: Unit.LOAD,
    Opcode.STORE: Unit.STORE,
    Opcode.MATMUL: Unit.MATRIX,
    Opcode.VMAP: Unit.VECTOR,
    Opcode.VADD: Unit.VECTOR,
    Opcode.VLUT: Unit.VECTOR,
    Opcode.VMUL: Unit.VECTOR,
    Opcode.POOL: Unit.VECTOR,
    Opcode.SYNC: None,  # decided by its `unit` field
    Opcode.END: None,
    Opcode.BARRIER: None,
    Opcode.FENCE: None,
    Opcode.CANCEL_POINT: None,
}


def _offsets() -> dict[Opcode, dict[str, int]]:
    out = {}
    for op, fields in FORMATS.items():
        pos = HEADER_BITS
        offs = {}
        for f in fields:
            offs[f.name] = pos
            pos += f.width
        assert pos <= INSTR_BITS, op
        out[op] = offs
    return out


OFFSETS = _offsets()
#: the on-chip address fields of each opcode (what moves when a program's buffers are relocated)
ONCHIP_ADDR_FIELDS: dict[Opcode, tuple[str, ...]] = {
    op: names
    for op, fields in FORMATS.items()
    if (names := tuple(f.name for f in fields if f.kind == "addr" and f.width == A))
}
#: bytes of a VLUT table: one int8 output per int8 input
LUT_BYTES = 256
FIELD_BY_NAME = {op: {f.name: f for f in fields} for op, fields in FORMATS.items()}


@dataclass(frozen=True)
class Instr:
    """One decoded instruction. `fields` always holds every field of the opcode."""

    op: Opcode
    fields: dict[str, int] = field(default_factory=dict, compare=False, hash=False)
    wait: int = 0
    signal: int = 0

    def __post_init__(self) -> None:
        known = FIELD_BY_NAME[self.op]
        for name in self.fields:
            if name not in known:
                raise IsaError(
                    ErrorCode.ILLEGAL_FIELD,
                    f"{MNEMONICS[self.op]} has no field {name!r}; fields: {', '.join(known) or 'none'}",
                )
        full = {f.name: self.fields.get(f.name, f.default) for f in FORMATS[self.op]}
        object.__setattr__(self, "fields", full)

    def __getattr__(self, name: str) -> int:
        try:
            return self.__dict__["fields"][name]
        except KeyError:
            raise AttributeError(name) from None

    def _key(self):
        return (self.op, tuple(sorted(self.fields.items())), self.wait, self.signal)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Instr) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @cached_property  # in the instance's dict (tokens do not change it): the hot loops read it often
    def unit(self) -> Unit | None:
        if self.op == Opcode.SYNC:
            return Unit(self.fields["unit"])
        return UNIT_OF[self.op]

    def with_tokens(self, wait: int, signal: int) -> Instr:
        """The same instruction with other token masks. Its fields were checked when it was made,
        so they are not checked again (the compiler re-tokens every instruction of a program several
        times); the footprint, which tokens do not change, comes along, and so does the fields dict
        itself (an instruction is immutable: nothing writes its fields after it is made), and so do
        the lists in which `validate` and `npu.timing.duration` remember their results, made here
        if the instruction has none yet so that it and every copy share them."""
        mine = self.__dict__
        for slot in MEMO_SLOTS:
            mine.setdefault(slot, [])
        new = object.__new__(Instr)
        d = new.__dict__
        d.update(mine)
        d["wait"], d["signal"] = wait, signal
        return new

    def __repr__(self) -> str:
        from .asm import format_instr

        return f"Instr<{format_instr(self)}>"


def make(
    op: Opcode | str, *, wait: Iterable[Unit] | int = 0, signal: Iterable[Unit] | int = 0, **fields: int
) -> Instr:
    """Convenience constructor: ``make("load", spad=0, dram=0x1000, rows=1, cols=64)``."""
    if isinstance(op, str):
        op = OPCODE_BY_MNEMONIC[op]
    return Instr(op, fields, _mask(wait), _mask(signal))


def _mask(units: Iterable[Unit] | int) -> int:
    if isinstance(units, int):
        return units
    m = 0
    for u in units:
        m |= 1 << int(u)
    return m


# --------------------------------------------------------------------------------------------------
# encoding


def encode(instr: Instr) -> bytes:
    """Pack to 32 little-endian bytes; raises IsaError if a value does not fit its field."""
    word = int(instr.op) | (instr.wait << 4) | (instr.signal << 8)
    if not 0 <= instr.wait < 16 or not 0 <= instr.signal < 16:
        raise IsaError(ErrorCode.ILLEGAL_FIELD, "token masks are 4 bits")
    for f in FORMATS[instr.op]:
        v = instr.fields[f.name]
        if not isinstance(v, int) or not f.lo <= v <= f.hi:
            raise IsaError(
                ErrorCode.ILLEGAL_FIELD,
                f"{MNEMONICS[instr.op]}.{f.name}={v!r} does not fit {f.width} "
                f"{'signed' if f.signed else 'unsigned'} bits ({f.lo}..{f.hi})",
            )
        if f.kind == "enum" and v >= len(f.choices):
            raise IsaError(ErrorCode.ILLEGAL_FIELD, f"{MNEMONICS[instr.op]}.{f.name}={v} is not a choice")
        word |= (v & ((1 << f.width) - 1)) << OFFSETS[instr.op][f.name]
    return word.to_bytes(INSTR_BYTES, "little")


def decode(data: bytes | int) -> Instr:
    """Unpack 32 bytes (or a 256-bit int); raises IsaError with the hardware's error code."""
    word = int.from_bytes(data, "little") if isinstance(data, (bytes, bytearray, memoryview)) else data
    opv = word & 0xF
    try:
        op = Opcode(opv)
    except ValueError:
        raise IsaError(ErrorCode.ILLEGAL_OPCODE, f"illegal opcode 0x{opv:x}") from None
    wait = (word >> 4) & 0xF
    signal = (word >> 8) & 0xF
    if (word >> 12) & 0xF:
        raise IsaError(ErrorCode.ILLEGAL_FIELD, f"{MNEMONICS[op]}: reserved header bits set")
    fields = {}
    pos = HEADER_BITS
    for f in FORMATS[op]:
        raw = (word >> pos) & ((1 << f.width) - 1)
        if f.signed and raw >> (f.width - 1):
            raw -= 1 << f.width
        if f.kind == "enum" and raw >= len(f.choices):
            raise IsaError(ErrorCode.ILLEGAL_FIELD, f"{MNEMONICS[op]}.{f.name}={raw} is not a choice")
        fields[f.name] = raw
        pos += f.width
    if word >> pos:
        raise IsaError(ErrorCode.ILLEGAL_FIELD, f"{MNEMONICS[op]}: reserved bits above bit {pos} set")
    return Instr(op, fields, wait, signal)


def encode_program(instrs: Iterable[Instr]) -> bytes:
    return b"".join(encode(i) for i in instrs)


def decode_program(blob: bytes) -> list[Instr]:
    if len(blob) % INSTR_BYTES:
        raise IsaError(
            ErrorCode.ILLEGAL_FIELD,
            f"program is {len(blob)} bytes, not a multiple of {INSTR_BYTES}",
        )
    out = []
    for i in range(0, len(blob), INSTR_BYTES):
        try:
            out.append(decode(blob[i : i + INSTR_BYTES]))
        except IsaError as e:
            raise IsaError(e.code, f"instruction {i // INSTR_BYTES}: {e}") from None
    return out


# --------------------------------------------------------------------------------------------------
# memory footprint and validation


class Span(NamedTuple):
    """A byte range [start, end) in one address space ("onchip" or "dram"). A named tuple: the
    compiler makes millions of them (a frozen dataclass took a tenth of an assembly's time)."""

    space: str
    start: int
    end: int

    def overlaps(self, other: Span) -> bool:
        return self.space == other.space and self.start < other.end and other.start < self.end


def extent(base: int, rows: int, width: int, stride: int) -> tuple[int, int]:
    """Bounding byte range of `rows` rows of `width` bytes, `stride` bytes apart (empty: (b, b))."""
    if rows <= 0 or width <= 0:
        return base, base
    return base, base + (rows - 1) * stride + width


def dram_span(i: Instr) -> tuple[int, int]:
    """The DRAM bytes [start, end) a LOAD reads or a STORE writes (what DRAM_RANGE and the memory
    window check); (0, 0) for other instructions."""
    if i.op not in (Opcode.LOAD, Opcode.STORE):
        return 0, 0
    f = i.fields
    return extent(f["dram"], f["rows"], f["cols"], f["dram_stride"])


def strided_apart(a: int, wa: int, b: int, wb: int, stride: int) -> bool:
    """Whether two accesses of rows `stride` bytes apart, one of rows of `wa` bytes from `a`, the
    other of `wb` bytes from `b`, can never touch the same byte, whatever their row counts: their
    bytes' offsets modulo `stride` (each a circular interval) are disjoint. A layer's channel slice
    of an HWC tensor and its neighbour's are apart though their bounding spans overlap."""
    if stride <= 0 or wa >= stride or wb >= stride:
        return False
    d = (b - a) % stride
    return d >= wa and stride - d >= wb


def strided_footprint(i: Instr) -> tuple[list[tuple], list[tuple]]:
    """(reads, writes) as (space, start, end, stride, width) tuples: a span of `footprint`, and
    where it is rows `stride` bytes apart of `width` bytes each (stride 0: take the span as it is;
    only a LOAD's and a STORE's rows are told apart). Two accesses with the same stride that
    `strided_apart` says are apart do not conflict."""
    reads, writes = footprint(i)
    if i.op not in (Opcode.LOAD, Opcode.STORE):
        r = w = (0, 0)
    else:
        f = i.fields
        dram = _rows(f["rows"], f["cols"], f["dram_stride"])
        if i.op == Opcode.LOAD:
            tr = f["pad_top"] + f["rows"] + f["pad_bottom"]
            r, w = dram, _rows(tr, f["pad_left"] + f["cols"] + f["pad_right"], f["spad_stride"])
        else:
            r, w = _rows(f["rows"], f["cols"], f["spad_stride"]), dram
    return [(s.space, s.start, s.end, *r) for s in reads], [(s.space, s.start, s.end, *w) for s in writes]


def _rows(rows: int, width: int, stride: int) -> tuple[int, int]:
    """(stride, width) of more than one row of `width` bytes narrower than their stride, else (0, 0)."""
    return (stride, width) if rows > 1 and 0 < width < stride else (0, 0)


def footprint(i: Instr) -> tuple[list[Span], list[Span]]:
    """(reads, writes) of an instruction as bounding spans; empty spans are left out. Computed once
    per instruction (instructions are immutable; the lists are shared: do not change them)."""
    fp = i.__dict__.get("_footprint")
    if fp is None:
        fp = _footprint(i)
        i.__dict__["_footprint"] = fp
    return fp


def _footprint(i: Instr) -> tuple[list[Span], list[Span]]:
    f = i.fields
    r: list[tuple[str, tuple[int, int]]] = []
    w: list[tuple[str, tuple[int, int]]] = []
    op = i.op
    if op == Opcode.LOAD:
        tr = f["pad_top"] + f["rows"] + f["pad_bottom"]
        tw = f["pad_left"] + f["cols"] + f["pad_right"]
        w.append(("onchip", extent(f["spad"], tr, tw, f["spad_stride"])))
        r.append(("dram", dram_span(i)))
    elif op == Opcode.STORE:
        r.append(("onchip", extent(f["spad"], f["rows"], f["cols"], f["spad_stride"])))
        w.append(("dram", dram_span(i)))
    elif op == Opcode.MATMUL:
        m, n, k = f["m"], f["n"], f["k"]
        if k > 0:
            r.append(("onchip", extent(f["a"], m, elem_bytes(f, "a") * k, f["a_stride"])))
            r.append(("onchip", extent(f["b"], n, k, f["b_stride"])))
        c = ("onchip", extent(f["c"], m, 4 * n, f["c_stride"]))
        w.append(c)
        if f["accumulate"]:
            r.append(c)
    elif op == Opcode.VMAP:
        es = 4 if f["src_type"] else elem_bytes(f, "src")
        r.append(("onchip", extent(f["src"], f["rows"], es * f["cols"], f["src_stride"])))
        if f["per_col"] and f["rows"] and f["cols"]:
            r.append(("onchip", (f["mults"], f["mults"] + 4 * f["cols"])))
            r.append(("onchip", (f["shifts"], f["shifts"] + f["cols"])))
        w.append(("onchip", extent(f["dst"], f["rows"], elem_bytes(f, "dst") * f["cols"], f["dst_stride"])))
    elif op == Opcode.VLUT:
        if f["rows"] and f["cols"]:
            r.append(("onchip", extent(f["src"], f["rows"], f["cols"], f["src_stride"])))
            r.append(("onchip", (f["table"], f["table"] + LUT_BYTES)))
            w.append(("onchip", extent(f["dst"], f["rows"], f["cols"], f["dst_stride"])))
    elif op == Opcode.VMUL:
        if f["rows"] and f["cols"]:
            for x, spans in (("a", r), ("b", r), ("dst", w)):
                spans.append(
                    ("onchip", extent(f[x], f["rows"], elem_bytes(f, x) * f["cols"], f[f"{x}_stride"]))
                )
    elif op == Opcode.VADD:
        n = f["len"]
        r.append(("onchip", (f["a"], f["a"] + elem_bytes(f, "a") * n)))
        r.append(("onchip", (f["b"], f["b"] + elem_bytes(f, "b") * n)))
        w.append(("onchip", (f["dst"], f["dst"] + elem_bytes(f, "dst") * n)))
    elif op == Opcode.POOL:
        c, oh, ow = f["channels"], f["out_h"], f["out_w"]
        if c and oh and ow:
            in_rows = (oh - 1) * f["sh"] + f["kh"]
            r.append(("onchip", (f["src"], f["src"] + in_rows * f["in_w"] * c * elem_bytes(f, "src"))))
            w.append(("onchip", (f["dst"], f["dst"] + oh * ow * c * elem_bytes(f, "dst"))))
    spans = lambda xs: [Span(s, a, b) for s, (a, b) in xs if b > a]  # noqa: E731
    return spans(r), spans(w)


def _err(code: ErrorCode, i: Instr, msg: str) -> IsaError:
    return IsaError(code, f"{MNEMONICS[i.op]}: {msg}")


def onchip_memory(start: int, end: int, cfg: NpuConfig) -> str | None:
    """'spad' or 'acc' if [start, end) lies wholly in that memory, else None."""
    if 0 <= start and end <= cfg.spad_bytes:
        return "spad"
    if ACC_BASE <= start and end <= ACC_BASE + cfg.acc_bytes:
        return "acc"
    return None


def validate(i: Instr, cfg: NpuConfig) -> None:
    """Check every rule an instruction must meet on `cfg`; raises IsaError with the error code.

    The hardware makes the same checks when it dispatches the instruction (docs/isa.md, "Errors").
    """
    unit = i.unit
    # tokens
    if unit is None and (i.wait or i.signal):
        raise _err(ErrorCode.ILLEGAL_FIELD, i, "control instructions carry no tokens")
    if unit is not None and ((i.wait | i.signal) >> int(unit)) & 1:
        raise _err(ErrorCode.ILLEGAL_FIELD, i, f"token mask names its own unit ({UNIT_NAMES[unit]})")
    # the rules below read only the fields: an instruction that passed them on `cfg` passes again
    per_config(i, "_valid_on", cfg, _validate_fields)


#: the slots of `per_config`'s results in an instruction (lists its `with_tokens` copies share)
MEMO_SLOTS = ("_valid_on", "_durations")


def per_config(i: Instr, slot: str, cfg: NpuConfig, compute):
    """`compute(i, cfg)`, remembered in the instruction's `slot` for each configuration object (the
    last 4): it must read only the fields, which never change once an instruction is made. The
    compiler's cost model validates and times each instruction of a program on every timing run,
    of a new copy of the program each time (`with_tokens`, whose copies share the slot), on the
    configuration and on its planning copy with a larger virtual DRAM."""
    known = i.__dict__.get(slot)
    if known is None:
        known = i.__dict__[slot] = []
    for c, value in known:
        if c is cfg:
            return value
    value = compute(i, cfg)  # an exception (an invalid instruction) is not remembered
    known.append((cfg, value))
    del known[:-4]
    return value


def _validate_fields(i: Instr, cfg: NpuConfig) -> None:
    """`validate`'s rules on the fields (every rule but the token masks')."""
    f = i.fields
    op = i.op
    # field rules
    if "shift" in f and f["shift"] > MAX_SHIFT:
        raise _err(ErrorCode.ILLEGAL_FIELD, i, f"shift={f['shift']} exceeds {MAX_SHIFT}")
    if "lo" in f and f["lo"] > f["hi"]:
        raise _err(ErrorCode.ILLEGAL_FIELD, i, f"clamp lo={f['lo']} > hi={f['hi']}")
    if op == Opcode.VMAP and f["src_type"] == 1 and f["zp_in"] != 0:
        raise _err(ErrorCode.ILLEGAL_FIELD, i, "zp_in must be 0 for an int32 source")
    if op == Opcode.VMAP and f["src_type"] == 1 and f["src_i16"]:
        raise _err(ErrorCode.ILLEGAL_FIELD, i, "src_i16 is for a scratchpad source (src_type=i8)")
    if op == Opcode.LOAD and f["pad_i16"] and (f["pad_left"] % 2 or f["pad_right"] % 2):
        raise _err(ErrorCode.ILLEGAL_FIELD, i, "int16 padding needs even pad_left and pad_right (bytes)")
    if op == Opcode.VMAP and f["per_col"] and f["cols"] > PER_COL_MAX:
        raise _err(
            ErrorCode.ILLEGAL_FIELD, i, f"per_col requantises at most {PER_COL_MAX} columns, cols={f['cols']}"
        )
    if op == Opcode.POOL and f["channels"] and f["out_h"] and f["out_w"]:
        if min(f["kh"], f["kw"], f["sh"], f["sw"]) == 0:
            raise _err(ErrorCode.ILLEGAL_FIELD, i, "pool window and strides must be >= 1")
        if (f["out_w"] - 1) * f["sw"] + f["kw"] > f["in_w"]:
            raise _err(
                ErrorCode.ILLEGAL_FIELD,
                i,
                f"windows need {(f['out_w'] - 1) * f['sw'] + f['kw']} input columns, in_w={f['in_w']}",
            )
    if op == Opcode.LOAD and f["spad_stride"] < f["pad_left"] + f["cols"] + f["pad_right"]:
        if f["pad_top"] + f["rows"] + f["pad_bottom"] > 1:
            raise _err(
                ErrorCode.ILLEGAL_FIELD,
                i,
                f"spad_stride={f['spad_stride']} is less than the padded row width "
                f"{f['pad_left'] + f['cols'] + f['pad_right']}",
            )
    # alignment
    if op == Opcode.MATMUL:
        for name in ("a", "a_stride", "b", "b_stride"):
            if f[name] % cfg.lanes:
                raise _err(
                    ErrorCode.MISALIGNED, i, f"{name}={f[name]} is not a multiple of lanes={cfg.lanes}"
                )
        for name in ("c", "c_stride"):
            if f[name] % cfg.acc_row_bytes:
                raise _err(
                    ErrorCode.MISALIGNED,
                    i,
                    f"{name}={f[name]} is not a multiple of the accumulator row ({cfg.acc_row_bytes} bytes)",
                )
    if op == Opcode.VMAP and f["src_type"] == 1:
        for name in ("src", "src_stride"):
            if f[name] % 4:
                raise _err(ErrorCode.MISALIGNED, i, f"{name}={f[name]} is not a multiple of 4 (int32 source)")
    for name, what, v, word in misaligned_operands(i, cfg)[:1]:
        raise _err(
            ErrorCode.MISALIGNED,
            i,
            f"{what}={v} is not a multiple of {word} bytes (a step of {name} takes two words "
            f"of {cfg.vector_lanes} lanes)",
        )
    # address ranges
    reads, writes = footprint(i)
    for s in reads + writes:
        if s.space == "dram":
            if s.end > cfg.dram_bytes:
                raise _err(
                    ErrorCode.DRAM_RANGE,
                    i,
                    f"DRAM range 0x{s.start:x}..0x{s.end:x} exceeds DRAM size 0x{cfg.dram_bytes:x}",
                )
        elif onchip_memory(s.start, s.end, cfg) is None:
            raise _err(
                ErrorCode.SPAD_RANGE,
                i,
                f"on-chip range 0x{s.start:x}..0x{s.end:x} is not inside the scratchpad "
                f"(0..0x{cfg.spad_bytes:x}) or the accumulators "
                f"(0x{ACC_BASE:x}..0x{ACC_BASE + cfg.acc_bytes:x})",
            )
    required = _required_memories(i)
    for s, mem, what in required:
        if s is not None and onchip_memory(s[0], s[1], cfg) != mem:
            raise _err(
                ErrorCode.SPAD_RANGE,
                i,
                f"{what} must lie in the {'accumulators' if mem == 'acc' else 'scratchpad'}",
            )
    # destination may not partially overlap a source (an identical element-wise operand is fine)
    _check_overlap(i)


#: vector operands: (opcode, address field, stride field or None, what counts its elements per row)
VECTOR_OPERANDS = {
    Opcode.VMAP: (("src", "src_stride", "cols"), ("dst", "dst_stride", "cols")),
    Opcode.VMUL: (("a", "a_stride", "cols"), ("b", "b_stride", "cols"), ("dst", "dst_stride", "cols")),
    Opcode.VADD: (("a", None, "len"), ("b", None, "len"), ("dst", None, "len")),
    Opcode.POOL: (("src", None, "channels"), ("dst", None, "channels")),
}


def vector_operand_word(f: dict, op: Opcode, name: str, cfg: NpuConfig) -> tuple[int, int]:
    """(element bytes, word bytes) of a vector operand: an int32 source is read as accumulator words
    (the bus width), everything else as scratchpad lane words."""
    if op == Opcode.VMAP and name == "src" and f["src_type"]:
        return 4, cfg.bus_bytes
    return elem_bytes(f, name), cfg.lanes


def wide_operands(i: Instr, cfg: NpuConfig) -> list[tuple[str, dict[str, int], int]]:
    """The operands of a vector instruction whose steps take more than one word (a step's
    `vector_lanes` elements need two: docs/isa.md, Timing), as (operand, {what: value} that must be
    multiples of the word, word bytes): its address, and its row pitch where it has more than one
    row (a pool's pixel pitch, channels x element bytes). A step reads two words of each operand,
    so an operand of at most a word's bytes a step may sit anywhere."""
    ops = VECTOR_OPERANDS.get(i.op)
    if ops is None or cfg.core == "micro":
        return []
    f = i.fields
    out = []
    for name, stride, count in ops:
        e, word = vector_operand_word(f, i.op, name, cfg)
        if min(cfg.vector_lanes, f[count]) * e <= word:
            continue
        values = {name: f[name]}
        if i.op == Opcode.POOL:
            values["pixel pitch"] = e * f["channels"]
        elif stride is not None and f["rows"] > 1:
            values[stride] = f[stride]
        out.append((name, values, word))
    return out


def misaligned_operands(i: Instr, cfg: NpuConfig) -> list[tuple[str, str, int, int]]:
    """(operand, what, value, word) of each value `wide_operands` asks to be a multiple of the word
    that is not: empty where the instruction keeps the rule."""
    return [(name, what, v, word) for name, values, word in wide_operands(i, cfg)
            for what, v in values.items() if v % word]  # fmt: skip


def _required_memories(i: Instr):
    f = i.fields
    op = i.op
    out = []
    if op == Opcode.MATMUL:
        if f["k"] and f["m"]:
            out.append((extent(f["a"], f["m"], elem_bytes(f, "a") * f["k"], f["a_stride"]), "spad", "A"))
        if f["k"] and f["n"]:
            out.append((extent(f["b"], f["n"], f["k"], f["b_stride"]), "spad", "B"))
        out.append((extent(f["c"], f["m"], 4 * f["n"], f["c_stride"]), "acc", "C"))
    elif op == Opcode.VMAP:
        es = 4 if f["src_type"] else elem_bytes(f, "src")
        out.append(
            (
                extent(f["src"], f["rows"], es * f["cols"], f["src_stride"]),
                "acc" if f["src_type"] else "spad",
                "an int32 source" if f["src_type"] else "a scratchpad source",
            )
        )
        out.append(
            (extent(f["dst"], f["rows"], elem_bytes(f, "dst") * f["cols"], f["dst_stride"]), "spad", "dst")
        )
        if f["per_col"] and f["rows"] and f["cols"]:
            out.append(((f["mults"], f["mults"] + 4 * f["cols"]), "spad", "mults"))
            out.append(((f["shifts"], f["shifts"] + f["cols"]), "spad", "shifts"))
    elif op in (Opcode.VADD, Opcode.POOL, Opcode.VLUT, Opcode.VMUL):
        reads, writes = footprint(i)
        for s in reads + writes:
            out.append(((s.start, s.end), "spad", "operands"))
    return [(s if s[1] > s[0] else None, m, w) for s, m, w in out]


def _check_overlap(i: Instr) -> None:
    """A destination may not overlap a source unless it is the identical element-wise operand."""
    f = i.fields
    spans: list[tuple[tuple[int, int], tuple[int, int]]] = []

    # "identical" includes the element type: an operand read as int8 and written as int16 in place
    # would be overwritten before it is read
    def same(x: str, stride: bool = True) -> bool:
        return (f[x] == f["dst"] and (not stride or f[f"{x}_stride"] == f["dst_stride"])
                and elem_bytes(f, x) == elem_bytes(f, "dst"))  # fmt: skip

    if (i.op == Opcode.VMAP and f["src_type"] == 0) or i.op == Opcode.VLUT:
        if not same("src"):
            spans.append(
                (
                    extent(f["src"], f["rows"], elem_bytes(f, "src") * f["cols"], f["src_stride"]),
                    extent(f["dst"], f["rows"], elem_bytes(f, "dst") * f["cols"], f["dst_stride"]),
                )
            )
    elif i.op == Opcode.VMUL:
        d = extent(f["dst"], f["rows"], elem_bytes(f, "dst") * f["cols"], f["dst_stride"])
        for x in ("a", "b"):
            if not same(x):
                spans.append((extent(f[x], f["rows"], elem_bytes(f, x) * f["cols"], f[f"{x}_stride"]), d))
    elif i.op == Opcode.VADD:
        n = f["len"]
        for x in ("a", "b"):
            if not same(x, stride=False):
                spans.append(
                    ((f[x], f[x] + elem_bytes(f, x) * n), (f["dst"], f["dst"] + elem_bytes(f, "dst") * n))
                )
    elif i.op == Opcode.POOL:
        reads, writes = footprint(i)
        if reads and writes:
            spans.append(((reads[0].start, reads[0].end), (writes[0].start, writes[0].end)))
    for (r0, r1), (w0, w1) in spans:
        if r1 > r0 and w1 > w0 and r0 < w1 and w0 < r1:
            raise _err(
                ErrorCode.ILLEGAL_FIELD,
                i,
                "destination overlaps a source (only an identical element-wise operand may)",
            )


# --------------------------------------------------------------------------------------------------
# hardware view of the formats


def struct_layout(op: Opcode):
    """The `amaranth.lib.data.StructLayout` of one opcode's 256-bit word (header + fields + pad)."""
    from amaranth.lib import data

    members: dict = {"opcode": Opcode, "wait": 4, "signal": 4, "_hdr_rsvd": 4}
    pos = HEADER_BITS
    from amaranth.hdl import signed, unsigned

    for f in FORMATS[op]:
        members[f.name] = signed(f.width) if f.signed else unsigned(f.width)
        pos += f.width
    if pos < INSTR_BITS:
        members["_rsvd"] = INSTR_BITS - pos
    return data.StructLayout(members)
