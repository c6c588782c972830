"""Regenerate the tables in docs/ from the shared definitions: ``python -m npu.docgen``.

The prose around the tables is hand-written; the tables between the GENERATED markers come from
`npu.isa`, `npu.registers` and `npu.config`, and a test checks that they are current.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

from .config import PRESETS, NpuConfig
from .isa import FORMATS, HEADER_BITS, INSTR_BITS, MNEMONICS, OFFSETS, UNIT_OF, ErrorCode, Opcode
from .registers import MAX_ENGINES, REGISTERS, SOC_REGISTERS, Control, Status, engine_window

DOCS = Path(__file__).resolve().parent.parent / "docs"


def formats_table() -> str:
    out = []
    for op in Opcode:
        unit = UNIT_OF[op]
        where = unit.name.lower() + " unit" if unit is not None else "dispatcher"
        if op == Opcode.SYNC:
            where = "the unit named by `unit`"
        out.append(f"#### `{MNEMONICS[op]}` (opcode 0x{int(op):x}, runs in: {where})\n")
        fields = FORMATS[op]
        if not fields:
            out.append("No fields; bits 16..255 are reserved (zero).\n")
            continue
        out.append("| bits | field | type | default | meaning |")
        out.append("|---|---|---|---|---|")
        end = HEADER_BITS
        for f in fields:
            lo = OFFSETS[op][f.name]
            end = lo + f.width
            typ = f"{'s' if f.signed else 'u'}{f.width}"
            if f.kind == "enum":
                typ += " (" + ", ".join(f"{i}={c}" for i, c in enumerate(f.choices)) + ")"
            default = "required" if f.always else str(f.default)
            out.append(f"| {lo}..{end - 1} | `{f.name}` | {typ} | {default} | {f.doc} |")
        out.append(f"\nBits {end}..{INSTR_BITS - 1} are reserved (zero).\n")
    return "\n".join(out)


def errors_table() -> str:
    docs = {
        ErrorCode.NONE: "no error",
        ErrorCode.ILLEGAL_OPCODE: "opcode not in the table above",
        ErrorCode.ILLEGAL_FIELD: "reserved bit set, enum out of range, token rule broken (tokens on a "
        "control instruction, a unit's own bit), shift > 62, lo > hi, int32 source with zp_in != 0, "
        "per_col with cols > 256, pool window wider than in_w or zero, LOAD rows overlapping, "
        "destination overlapping a source",
        ErrorCode.MISALIGNED: "MATMUL a/b/strides not multiples of `lanes`, c/c_stride not multiples "
        "of the accumulator row; VMAP int32 source not 4-byte aligned",
        ErrorCode.SPAD_RANGE: "on-chip range outside the scratchpad and the accumulators, straddling "
        "them, or in the wrong one for the operand",
        ErrorCode.DRAM_RANGE: "DMA range or instruction fetch outside DRAM; PROGRAM_BASE misaligned",
        ErrorCode.DEADLOCK: "no unit can start and dispatch cannot proceed (e.g. a pop whose push "
        "never comes: token underflow)",
        ErrorCode.TOKEN: "a channel exceeds `token_depth`, or tokens are outstanding at END",
        ErrorCode.TIMEOUT: "the run exceeded the TIMEOUT register's cycle limit",
        ErrorCode.BUS: "the memory answered a burst with SLVERR or DECERR (a LOAD's or an instruction "
        "fetch's read, a STORE's write response); ERROR_PC: that LOAD, STORE or instruction",
        ErrorCode.PROTECTION: "a LOAD's or STORE's DRAM range, or an instruction fetch, outside the memory "
        "window [DRAM_BASE, DRAM_LIMIT); nothing of the access is done; FAULT_ADDR: its first byte",
    }
    rows = ["| code | name | raised when |", "|---|---|---|"]
    rows += [f"| {int(c)} | `{c.name}` | {docs[c]} |" for c in ErrorCode]
    return "\n".join(rows)


def registers_table() -> str:
    rows = ["| offset | name | access | meaning |", "|---|---|---|---|"]
    for r in REGISTERS:
        off = f"0x{r.offset:02x}" + (f" / 0x{r.offset + 4:02x}" if r.wide else "")
        name = r.name + (" (LO / HI)" if r.wide else "")
        rows.append(f"| {off} | `{name}` | {r.access} | {r.doc} |")
    rows.append("")
    rows.append("CONTROL bits: " + ", ".join(f"{c.value:#x} `{c.name}`" for c in Control))
    rows.append("")
    rows.append(
        "STATUS values (exactly one bit set): " + ", ".join(f"{s.value:#x} `{s.name}`" for s in Status)
    )
    return "\n".join(rows)


def soc_registers_table() -> str:
    rows = ["| offset | name | access | meaning |", "|---|---|---|---|"]
    for r in SOC_REGISTERS:
        rows.append(f"| 0x{r.offset:02x} | `{r.name}` | {r.access} | {r.doc} |")
    rows.append(
        f"| 0x{engine_window(0):03x} + 0x100 * i | engine i | | the register window above, one per engine "
        f"(at most {MAX_ENGINES} engines) |"
    )
    return "\n".join(rows)


def presets_table() -> str:
    cfgs = list(PRESETS.values())
    fields = [f.name for f in dataclasses.fields(NpuConfig) if f.name != "name"]
    rows = ["| field | " + " | ".join(c.name for c in cfgs) + " |", "|---|" + "---|" * len(cfgs)]
    for f in fields:
        rows.append(f"| `{f}` | " + " | ".join(str(getattr(c, f)) for c in cfgs) + " |")
    rows.append("| MACs per cycle | " + " | ".join(str(c.macs_per_cycle) for c in cfgs) + " |")
    rows.append("| configuration id | " + " | ".join(f"0x{c.config_id:08x}" for c in cfgs) + " |")
    return "\n".join(rows)


SECTIONS = {
    "isa.md": {"formats": formats_table, "errors": errors_table, "presets": presets_table},
    "registers.md": {"registers": registers_table, "soc": soc_registers_table},
}


def render(name: str, text: str) -> str:
    for key, fn in SECTIONS[name].items():
        pat = re.compile(rf"(<!-- BEGIN GENERATED: {key} -->\n).*?(<!-- END GENERATED: {key} -->)", re.DOTALL)
        if not pat.search(text):
            raise ValueError(f"docs/{name}: missing GENERATED markers for {key!r}")
        text = pat.sub(lambda m, fn=fn: m.group(1) + fn() + "\n" + m.group(2), text)
    return text


def main() -> int:
    for name in SECTIONS:
        p = DOCS / name
        p.write_text(render(name, p.read_text()))
        print(f"updated {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
