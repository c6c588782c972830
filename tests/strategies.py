"""Hypothesis strategies for instructions."""

from hypothesis import strategies as st

from npu.isa import FORMATS, UNIT_OF, Instr, Opcode


@st.composite
def instructions(draw, ops=tuple(Opcode)):
    op = draw(st.sampled_from(ops))
    fields = {}
    for f in FORMATS[op]:
        if f.kind == "enum":
            fields[f.name] = draw(st.integers(0, len(f.choices) - 1))
        else:
            fields[f.name] = draw(
                st.one_of(st.integers(f.lo, f.hi), st.sampled_from([f.lo, f.hi, f.default]))
            )
    if UNIT_OF[op] is None and op != Opcode.SYNC:
        wait = signal = 0
    else:
        wait = draw(st.integers(0, 15))
        signal = draw(st.integers(0, 15))
    return Instr(op, fields, wait, signal)
