"""Text assembly: parse `.s` files into instructions and print instructions as canonical text.

Syntax (docs/isa.md, "Assembly"): one instruction per line, ``mnemonic field=value ...`` with
``wait=unit[,unit]`` and ``signal=unit[,unit]`` for tokens; ``#`` or ``;`` start a comment. Numbers
are decimal, ``0x`` hex or ``0b`` binary, optionally negative; ``_`` may group digits. Omitted fields
take their defaults. Directives describe the run, not the program:

    .config NAME                             configuration the program is written for
    .data ADDR random DTYPE SHAPE [seed=N]   fill DRAM at ADDR with seeded random values
    .data ADDR file PATH                     copy a .npy file (relative to the .s file) to DRAM
    .output NAME ADDR DTYPE SHAPE            a result to read back from DRAM after the run

The canonical text of an instruction names its non-default fields in format order (addresses in hex)
followed by its tokens; :func:`disassemble` (assemble(text)) reproduces canonical text exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from npu.errors import NpuError

from .isa import (
    FIELD_BY_NAME,
    FORMATS,
    MNEMONICS,
    OPCODE_BY_MNEMONIC,
    UNIT_NAMES,
    Instr,
    IsaError,
    Unit,
    decode_program,
    encode,
)

DTYPES = {"i8": "int8", "u8": "uint8", "i16": "int16", "i32": "int32"}
_UNIT_BY_NAME = {v: Unit(k) for k, v in UNIT_NAMES.items()}


class AsmError(NpuError, ValueError):
    """Malformed assembly; the message starts with ``file:line:``."""


@dataclass
class DataInit:
    addr: int
    kind: str  # "random" or "file"
    dtype: str = "i8"
    shape: tuple[int, ...] = ()
    seed: int = 0
    path: str = ""
    line: int = 0


@dataclass
class Output:
    name: str
    addr: int
    dtype: str
    shape: tuple[int, ...]


@dataclass
class Assembly:
    instrs: list[Instr] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # source line of each instruction
    config: str | None = None
    data: list[DataInit] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    source: str = "<asm>"

    def binary(self) -> bytes:
        return b"".join(encode(i) for i in self.instrs)


def parse_int(text: str) -> int:
    t = text.replace("_", "").lower()
    neg = t.startswith("-")
    if neg or t.startswith("+"):
        t = t[1:]
    if not t:
        raise ValueError("empty number")
    if t.startswith("0x"):
        v = int(t[2:], 16)
    elif t.startswith("0b"):
        v = int(t[2:], 2)
    else:
        if not t.isdigit():
            raise ValueError(f"not a number: {text!r}")
        v = int(t, 10)
    return -v if neg else v


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"bad shape {text!r}; write e.g. 64x32") from None
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"bad shape {text!r}; dimensions must be positive")
    return dims


def parse_dtype(text: str) -> str:
    if text not in DTYPES:
        raise ValueError(f"unknown dtype {text!r}; choose one of {', '.join(DTYPES)}")
    return text


def _units(text: str) -> int:
    mask = 0
    for name in filter(None, text.split(",")):
        if name not in _UNIT_BY_NAME:
            raise ValueError(f"unknown unit {name!r}; units are {', '.join(_UNIT_BY_NAME)}")
        mask |= 1 << int(_UNIT_BY_NAME[name])
    return mask


def _parse_instr(words: list[str]) -> Instr:
    mnem = words[0].lower()
    if mnem not in OPCODE_BY_MNEMONIC:
        raise ValueError(f"unknown instruction {words[0]!r}; known: {', '.join(OPCODE_BY_MNEMONIC)}")
    op = OPCODE_BY_MNEMONIC[mnem]
    known = FIELD_BY_NAME[op]
    fields: dict[str, int] = {}
    wait = signal = 0
    seen = set()
    for w in words[1:]:
        if "=" not in w:
            raise ValueError(f"expected field=value, got {w!r}")
        name, _, val = w.partition("=")
        name = name.lower()
        if name in seen:
            raise ValueError(f"field {name!r} given twice")
        seen.add(name)
        if name == "wait":
            wait = _units(val)
        elif name == "signal":
            signal = _units(val)
        elif name in known:
            f = known[name]
            if f.kind == "enum":
                if val not in f.choices:
                    raise ValueError(f"{mnem}.{name}: {val!r} is not one of {', '.join(f.choices)}")
                v = f.choices.index(val)
            else:
                try:
                    v = parse_int(val)
                except ValueError:
                    raise ValueError(f"{mnem}.{name}: {val!r} is not a number") from None
                if not f.lo <= v <= f.hi:
                    raise ValueError(
                        f"{mnem}.{name}={v} does not fit {f.width} "
                        f"{'signed' if f.signed else 'unsigned'} bits ({f.lo}..{f.hi})"
                    )
            fields[name] = v
        else:
            choices = ", ".join([*known, "wait", "signal"])
            raise ValueError(f"{mnem} has no field {name!r}; fields: {choices}")
    missing = [f.name for f in known.values() if f.always and f.name not in fields]
    if missing:  # the fields that identify the instruction have no sensible default
        raise ValueError(f"{mnem} needs {', '.join(f'{m}=...' for m in missing)}")
    return Instr(op, fields, wait, signal)


def assemble(text: str, source: str = "<asm>") -> Assembly:
    """Parse assembly text; raises AsmError naming the file and line of the first problem."""
    out = Assembly(source=source)
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = re.split(r"[#;]", raw, maxsplit=1)[0].strip()
        if not line:
            continue
        words = line.split()
        try:
            if words[0].startswith("."):
                _directive(out, words, lineno)
            else:
                out.instrs.append(_parse_instr(words))
                out.lines.append(lineno)
        except (ValueError, IsaError) as e:
            raise AsmError(f"{source}:{lineno}: {e}") from None
    return out


def _directive(out: Assembly, words: list[str], lineno: int) -> None:
    d = words[0].lower()
    args = words[1:]
    if d == ".config":
        if len(args) != 1:
            raise ValueError(".config takes one name")
        out.config = args[0]
    elif d == ".data":
        if len(args) < 3:
            raise ValueError(".data ADDR random DTYPE SHAPE [seed=N] | .data ADDR file PATH")
        addr = parse_int(args[0])
        if args[1] == "file":
            out.data.append(DataInit(addr, "file", path=args[2], line=lineno))
        elif args[1] == "random":
            if len(args) < 4:
                raise ValueError(".data ADDR random DTYPE SHAPE [seed=N]")
            seed = 0
            for extra in args[4:]:
                k, _, v = extra.partition("=")
                if k != "seed":
                    raise ValueError(f"unknown .data option {extra!r}")
                seed = parse_int(v)
            out.data.append(
                DataInit(addr, "random", parse_dtype(args[2]), parse_shape(args[3]), seed, line=lineno)
            )
        else:
            raise ValueError(f".data source must be 'random' or 'file', not {args[1]!r}")
    elif d == ".output":
        if len(args) != 4:
            raise ValueError(".output NAME ADDR DTYPE SHAPE")
        out.outputs.append(Output(args[0], parse_int(args[1]), parse_dtype(args[2]), parse_shape(args[3])))
    else:
        raise ValueError(f"unknown directive {words[0]!r}; known: .config, .data, .output")


def format_instr(i: Instr) -> str:
    """Canonical one-line text of an instruction."""
    parts = [MNEMONICS[i.op]]
    for f in FORMATS[i.op]:
        v = i.fields[f.name]
        if v == f.default and not f.always:
            continue
        if f.kind == "addr":
            parts.append(f"{f.name}=0x{v:x}")
        elif f.kind == "enum":
            parts.append(f"{f.name}={f.choices[v] if v < len(f.choices) else v}")
        else:
            parts.append(f"{f.name}={v}")
    for name, mask in (("wait", i.wait), ("signal", i.signal)):
        if mask:
            parts.append(f"{name}=" + ",".join(UNIT_NAMES[Unit(u)] for u in range(4) if mask >> u & 1))
    return " ".join(parts)


def disassemble(
    program: bytes | list[Instr], annotate: dict[int, str] | None = None, show_pc: bool = False
) -> str:
    """Canonical text of a program, one instruction per line (re-assembles to the same bytes)."""
    instrs = decode_program(program) if isinstance(program, (bytes, bytearray)) else program
    lines = []
    for pc, ins in enumerate(instrs):
        text = format_instr(ins)
        notes = []
        if show_pc:
            notes.append(f"pc {pc}")
        if annotate and pc in annotate:
            notes.append(annotate[pc])
        if notes:
            text = f"{text:<72} # {'; '.join(notes)}"
        lines.append(text)
    return "\n".join(lines) + ("\n" if lines else "")


def read_asm(path: str | Path) -> Assembly:
    p = Path(path)
    if p.is_dir():
        raise AsmError(f"{p}: is a directory, not an assembly file")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise AsmError(f"{p}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        line = p.read_bytes()[: e.start].count(b"\n") + 1
        raise AsmError(f"{p}:{line}: not UTF-8 text (byte 0x{e.object[e.start]:02x})") from None
    return assemble(text, str(p))
