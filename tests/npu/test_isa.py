import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu.asm import AsmError, assemble, disassemble, format_instr
from npu.config import ACC_BASE, get_config
from npu.isa import (
    FORMATS,
    INSTR_BITS,
    ErrorCode,
    Instr,
    IsaError,
    Opcode,
    Unit,
    decode,
    encode,
    make,
    struct_layout,
    validate,
)
from tests.strategies import instructions

CFG = get_config("default")


@settings(max_examples=1500)
@given(instructions())
def test_decode_encode_roundtrip(ins):
    blob = encode(ins)
    assert len(blob) == 32
    assert decode(blob) == ins


@settings(max_examples=1500)
@given(st.integers(0, (1 << INSTR_BITS) - 1))
def test_any_word_decodes_exactly_or_is_rejected(word):
    try:
        ins = decode(word.to_bytes(32, "little"))
    except IsaError as e:
        assert e.code in (ErrorCode.ILLEGAL_OPCODE, ErrorCode.ILLEGAL_FIELD)
        assert str(e)
    else:
        assert int.from_bytes(encode(ins), "little") == word


def _noisy_text(ins: Instr, rng: random.Random) -> str:
    """A non-canonical but equivalent spelling of an instruction."""
    parts = []
    for f in FORMATS[ins.op]:
        v = ins.fields[f.name]
        if v == f.default and not f.always and rng.random() < 0.6:
            continue
        if f.kind == "enum":
            text = f.choices[v]
        else:
            style = rng.choice(["dec", "hex", "under"])
            if style == "hex":
                text = ("-" if v < 0 else "") + hex(abs(v))
            elif style == "under" and abs(v) >= 1000:
                text = f"{v:_}"
            else:
                text = str(v)
        parts.append(f"{f.name}={text}")
    names = ["load", "matrix", "vector", "store"]
    for key, mask in (("wait", ins.wait), ("signal", ins.signal)):
        units = [names[u] for u in range(4) if mask >> u & 1]
        rng.shuffle(units)
        if units or rng.random() < 0.2:
            parts.append(f"{key}={','.join(units)}")
    rng.shuffle(parts)
    mnem = ins.op.name.lower()
    mnem = mnem.upper() if rng.random() < 0.3 else mnem
    comment = rng.choice(["", "  # note", " ; other note"])
    return "   " + " ".join([mnem, *parts]) + comment


@settings(max_examples=1200)
@given(st.lists(instructions(), min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_disasm_of_asm_is_canonical(instrs, rng):
    lines = []
    for ins in instrs:
        if rng.random() < 0.3:
            lines.append(rng.choice(["", "# comment only", "   ; another"]))
        lines.append(_noisy_text(ins, rng))
    text = "\n".join(lines) + "\n"
    asm = assemble(text)
    assert asm.instrs == instrs
    canonical = "".join(format_instr(i) + "\n" for i in instrs)
    assert disassemble(asm.instrs) == canonical
    assert disassemble(asm.binary()) == canonical
    assert assemble(canonical).instrs == instrs


BAD_LINES = [
    ("frobnicate rows=1", "unknown instruction"),
    ("load rows=1 rowz=2", "no field 'rowz'"),
    ("load rows=70000", "does not fit 16 unsigned bits"),
    ("vmap lo=-129", "does not fit 8 signed bits"),
    ("load rows", "expected field=value"),
    ("load rows=12abc", "is not a number"),
    ("load rows=1 rows=2", "given twice"),
    ("matmul wait=dma", "unknown unit 'dma'"),
    ("pool mode=median", "is not one of max, avg"),
    (".bogus 1", "unknown directive"),
    (".data 0x100 random i9 4x4", "unknown dtype"),
    (".data 0x100 random i8 4xq", "bad shape"),
]


@pytest.mark.parametrize("bad,msg", BAD_LINES)
@settings(max_examples=90)  # 12 kinds x 90 = 1080 examples
@given(st.lists(instructions(), min_size=0, max_size=5), st.integers(0, 5))
def test_malformed_assembly_names_line(bad, msg, good, where):
    lines = [format_instr(i) for i in good]
    where = min(where, len(lines))
    lines.insert(where, bad)
    with pytest.raises(AsmError) as e:
        assemble("\n".join(lines), "prog.s")
    assert f"prog.s:{where + 1}:" in str(e.value)
    assert msg in str(e.value)


def test_decode_errors_name_the_problem():
    with pytest.raises(IsaError) as e:
        decode(bytes([0xF] + [0] * 31))
    assert e.value.code == ErrorCode.ILLEGAL_OPCODE and "opcode 0xf" in str(e.value)
    word = int.from_bytes(encode(make("end")), "little") | (1 << 200)
    with pytest.raises(IsaError) as e:
        decode(word.to_bytes(32, "little"))
    assert e.value.code == ErrorCode.ILLEGAL_FIELD and "reserved" in str(e.value)
    with pytest.raises(IsaError) as e:
        decode(bytes([0x1, 0x10] + [0] * 30))  # END with a reserved header bit
    assert e.value.code == ErrorCode.ILLEGAL_FIELD


@pytest.mark.parametrize(
    "ins,code,msg",
    [
        (make("end", wait=1), ErrorCode.ILLEGAL_FIELD, "control instructions carry no tokens"),
        (make("load", rows=1, cols=1, wait=1), ErrorCode.ILLEGAL_FIELD, "its own unit"),
        (make("vmap", rows=1, cols=1, lo=5, hi=4), ErrorCode.ILLEGAL_FIELD, "lo=5 > hi=4"),
        (make("vmap", rows=1, cols=1, shift=63), ErrorCode.ILLEGAL_FIELD, "shift=63"),
        (make("matmul", a=1, m=1, n=1, k=1, c=ACC_BASE), ErrorCode.MISALIGNED, "a=1"),
        (make("matmul", m=1, n=1, k=1, c=ACC_BASE + 4), ErrorCode.MISALIGNED, "c=524292"),
        (make("load", spad=CFG.spad_bytes - 1, rows=1, cols=2), ErrorCode.SPAD_RANGE, "on-chip range"),
        (make("load", dram=CFG.dram_bytes - 1, rows=1, cols=2), ErrorCode.DRAM_RANGE, "DRAM range"),
        (make("matmul", m=1, n=1, k=8, c=0), ErrorCode.SPAD_RANGE, "C must lie in the accumulators"),
        (make("vadd", a=0, b=64, dst=8, len=16), ErrorCode.ILLEGAL_FIELD, "overlaps"),
        (
            make("pool", channels=1, in_w=2, out_h=1, out_w=2, kh=2, kw=2, sh=1, sw=1),
            ErrorCode.ILLEGAL_FIELD,
            "input columns",
        ),
    ],
)
def test_validate_reports_error_codes(ins, code, msg):
    with pytest.raises(IsaError) as e:
        validate(ins, CFG)
    assert e.value.code == code
    assert msg in str(e.value)


@settings(max_examples=200)
@given(instructions())
def test_amaranth_layout_matches_encoder(ins):
    """The hardware's struct view of a word sees the same field values the encoder packed."""
    from amaranth.lib import data

    layout = struct_layout(ins.op)
    assert layout.size == INSTR_BITS
    view = data.Const(layout, int.from_bytes(encode(ins), "little"))
    assert view.opcode == int(ins.op)
    assert view.wait == ins.wait and view.signal == ins.signal
    for f in FORMATS[ins.op]:
        assert int(getattr(view, f.name)) == ins.fields[f.name], f.name


def test_assembler_directives():
    asm = assemble(
        ".config tiny\n.data 0x100 random i8 4x8 seed=3\n.data 0x200 file x.npy\n"
        ".output Y 0x300 i32 2x2\nend\n"
    )
    assert asm.config == "tiny"
    assert asm.data[0].shape == (4, 8) and asm.data[0].seed == 3
    assert asm.data[1].path == "x.npy"
    assert asm.outputs[0].name == "Y" and asm.outputs[0].dtype == "i32"
    assert len(asm.instrs) == 1 and asm.instrs[0].op == Opcode.END


def test_validation_is_remembered_per_configuration_and_shared_by_copies():
    """`validate` remembers the configurations an instruction passed on (its copies share the list,
    `with_tokens`), so a copy is not checked again there - but an instruction valid on one
    configuration is still checked, and refused, on another where it is not."""
    big = get_config("default")
    small = big.replace(dram_bytes=1 << 16)
    ins = make("load", spad=0, dram=1 << 20, rows=1, cols=16, spad_stride=16, dram_stride=16)
    validate(ins, big)
    copy = ins.with_tokens(0, 1 << int(Unit.MATRIX))
    passed = copy.__dict__["_valid_on"]
    assert passed is ins.__dict__["_valid_on"] and any(c is big for c, _ in passed)
    with pytest.raises(IsaError) as e:
        validate(copy, small)
    assert e.value.code == ErrorCode.DRAM_RANGE
    with pytest.raises(IsaError):  # the token rules are checked every time
        validate(ins.with_tokens(1 << int(Unit.LOAD), 0), big)
