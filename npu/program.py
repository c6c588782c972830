"""Program builder: emit unit instructions in program order and get dependency tokens for free.

Every tool that writes NPU programs (the compiler, the driver's dump/restore programs, examples and
benchmarks) goes through this builder so that the token rules of docs/isa.md hold by construction:

* Conflicts are found from each instruction's memory footprint (`npu.isa.footprint`): a read after
  a write, a write after a read or a write after a write of overlapping on-chip or DRAM bytes by
  instructions of different units. Instructions of one unit are ordered by their queue already.
* For each conflict the consumer waits for one token from the latest conflicting producer; vector
  clocks drop every dependency that is already implied by an earlier token, so a program carries few
  tokens. Every pop follows its push in program order, so the program cannot deadlock
  (docs/isa.md, "Deadlock-free rules").
* Tokens may cross a cancellation point: a pause keeps the channels' counts (RESUME_TOKENS) and
  the resume restores them (docs/isa.md). No token crosses a barrier, a fence or the end.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .config import NpuConfig
from .isa import (
    ErrorCode,
    Instr,
    IsaError,
    Opcode,
    Unit,
    make,
    misaligned_operands,
    strided_apart,
    strided_footprint,
    validate,
    vector_operand_word,
)
from .timing import duration

NUNITS = len(Unit)


@dataclass
class Item:
    """One entry of a program being built; compilers keep lists of them to reorder and join."""

    kind: str  # "instr", "cp", "barrier", "fence", "drain", "cand" (a place a point may go; emits nothing)
    instr: Instr | None = None
    cp_id: int = 0
    label: str = ""


class _Hist:
    """One emitted instruction of a unit, as the token assignment sees it."""

    __slots__ = ("pos", "w", "rw", "clock", "wait", "signal")

    def __init__(self, pos: int, w: list, rw: list, clock: tuple[int, ...], wait: int):
        self.pos = pos  # index in the output program
        self.w, self.rw = w, rw  # (space, start, end) it writes; it reads or writes
        self.clock = clock  # per unit: last instruction known complete when this one completes
        self.wait = wait  # the producers it waits for (a token each)
        self.signal = 0


def _span_tuples(ins: Instr) -> tuple[list, list, list]:
    """(reads, writes, reads + writes) of an instruction as (space, start, end) tuples, which the
    conflict scan compares inline (its hot loop); cached on the immutable instruction. Plain tuples,
    not the footprint's named-tuple spans: the collector does not track tuples of atomic values,
    and the tracked spans made a warm 56,000-instruction build 0.67 -> 1.2 s."""
    d = ins.__dict__
    t = d.get("_span_tuples")
    if t is None:
        rs, ws = strided_footprint(ins) if ins.op != Opcode.SYNC else ([], [])
        t = d["_span_tuples"] = (rs, ws, rs + ws)
    return t


@dataclass
class BuiltProgram:
    instrs: list[Instr]
    labels: dict[int, str] = field(default_factory=dict)  # pc -> label given to add()
    cancel_points: dict[int, int] = field(default_factory=dict)  # cp id -> pc
    item_pcs: list[int] = field(default_factory=list)  # builder item index -> pc of its instruction


class ProgramBuilder:
    def __init__(self, cfg: NpuConfig, *, check: bool = True):
        self.cfg = cfg
        self.check = check
        self._items: list[Item] = []
        self._cp_ids: set[int] = set()

    def add(self, instr: Instr | str, label: str = "", **fields: int) -> None:
        """Append a unit instruction (tokens are assigned by `build`; any given are discarded)."""
        if isinstance(instr, str):
            instr = make(instr, **fields)
        if instr.unit is None:
            raise ValueError(f"{instr.op.name} is a control instruction; use cancel_point/barrier")
        instr = instr.with_tokens(0, 0)
        for piece in split_misaligned(instr, self.cfg):
            if self.check:
                validate(piece, self.cfg)  # remembered by the instruction and the copies `build` makes
            self._items.append(Item("instr", piece, label=label))

    def cancel_point(self, cp_id: int) -> None:
        if cp_id in self._cp_ids:
            raise ValueError(f"cancellation point id {cp_id} used twice")
        self._cp_ids.add(cp_id)
        self._items.append(Item("cp", cp_id=cp_id))

    def candidate(self) -> None:
        """Mark a place between instructions where a compiler may put a cancellation point (a
        later pass turns chosen candidates into points; `build` ignores the rest)."""
        self._items.append(Item("cand"))

    def drain(self) -> None:
        """SYNCs that hold every unit until every other unit has finished the work before them (a
        cancellation point after them is passed by no unit before all have reached it); unlike a
        barrier, dispatch goes on."""
        self._items.append(Item("drain"))

    def barrier(self) -> None:
        self._items.append(Item("barrier"))

    def fence(self) -> None:
        """A FENCE: like a barrier (no token crosses it), and it reports its completion."""
        self._items.append(Item("fence"))

    def extend(self, items: Iterable[Item]) -> None:
        """Append items taken from another builder (`items`): fragments joined into one program.
        Cancellation point ids must stay unique."""
        for it in items:
            if it.kind == "cp":
                self.cancel_point(it.cp_id)
            else:
                self._items.append(it)

    @property
    def items(self) -> list[Item]:
        """A copy of the items added so far, in order."""
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def build(self, end: bool = True) -> BuiltProgram:
        prog = self._assign()
        if end:
            prog.instrs.append(make(Opcode.END))
        return prog

    # -- token assignment ---------------------------------------------------------------------------
    def _assign(self) -> BuiltProgram:
        out: list[Instr] = []
        labels: dict[int, str] = {}
        cps: dict[int, int] = {}
        hist: list[list[_Hist]] = [[] for _ in range(NUNITS)]
        known = [[-1] * NUNITS for _ in range(NUNITS)]  # known[u][p]

        def emit(ins: Instr, everything: bool = False) -> None:
            u = int(ins.unit)
            rs, ws, rws = _span_tuples(ins)
            known_u = known[u]
            wait = 0
            for p in range(NUNITS):
                if p == u:
                    continue
                j = len(hist[p]) - 1 if everything else _latest_conflict(hist[p], known_u[p], rs, ws)
                if j <= known_u[p]:
                    continue
                h = hist[p][j]
                h.signal |= 1 << u
                wait |= 1 << p
                known_u = known[u] = [a if a >= b else b for a, b in zip(known_u, h.clock, strict=False)]
            seq = len(hist[u])
            known_u[u] = seq
            hist[u].append(_Hist(len(out), ws, rws, tuple(known_u), wait))
            out.append(ins)  # its tokens are set once its signals are known (below)

        item_pcs: list[int] = []
        for item in self._items:
            item_pcs.append(len(out))
            if item.kind == "instr":
                if item.label:
                    labels[len(out)] = item.label
                emit(item.instr)
            elif item.kind == "cand":
                continue
            elif item.kind == "drain":  # each unit waits for the others' latest instruction
                for u in range(NUNITS):
                    emit(make(Opcode.SYNC, unit=u), everything=True)
            elif item.kind in ("barrier", "fence"):
                out.append(make(Opcode.BARRIER if item.kind == "barrier" else Opcode.FENCE))
                last = [len(h) - 1 for h in hist]
                known = [list(last) for _ in range(NUNITS)]
            else:
                cps[item.cp_id] = len(out)
                out.append(make(Opcode.CANCEL_POINT, id=item.cp_id))
        # the token masks, one new instruction each (the same one where they are its own already)
        for u in range(NUNITS):
            for h in hist[u]:
                ins = out[h.pos]
                if h.wait != ins.wait or h.signal != ins.signal:
                    out[h.pos] = ins.with_tokens(h.wait, h.signal)
        prog = BuiltProgram(out, labels, cps, item_pcs)
        if self.check:
            check_tokens(out, self.cfg)
        return prog


#: per opcode: (address fields that advance with the columns, the field counting them); a per-column
#: VMAP's multipliers (4 bytes a column) and shifts (1) advance too
_COLUMN_FIELDS = {
    Opcode.VMAP: (("src", "dst"), "cols"),
    Opcode.VMUL: (("a", "b", "dst"), "cols"),
    Opcode.VADD: (("a", "b", "dst"), "len"),
}


def split_misaligned(ins: Instr, cfg: NpuConfig) -> list[Instr]:
    """`ins`, or where one of its vector operands would take two words a step from an address (or
    row pitch) that is not word-aligned (npu.isa.wide_operands: MISALIGNED), the same work as
    instructions of at most a word of each operand per row, which may sit anywhere: each column
    range of the rows is independent of the others, so the values are the same. A pool is left
    as it is (its pixel pitch cannot be split)."""
    cols = _COLUMN_FIELDS.get(ins.op)
    if cols is None or not misaligned_operands(ins, cfg):
        return [ins]
    names, count = cols
    f = ins.fields
    size = {n: vector_operand_word(f, ins.op, n, cfg) for n in names}
    per = min(word // e for e, word in size.values())
    out = []
    for c0 in range(0, f[count], per):
        g = dict(f)
        g[count] = min(per, f[count] - c0)
        for n in names:
            g[n] = f[n] + c0 * size[n][0]
        if ins.op == Opcode.VMAP and f["per_col"]:
            g["mults"], g["shifts"] = f["mults"] + 4 * c0, f["shifts"] + c0
        out.append(Instr(ins.op, g))
    return out


def token_syncs(counts: dict[tuple[int, int], int]) -> list[Instr]:
    """SYNC instructions that push the tokens `counts` {(producer, consumer): n} (e.g. a paused
    program's RESUME_TOKENS, `npu.registers.unpack_tokens`) into empty channels: for each producer,
    as many SYNCs as its largest count, the k-th signalling every consumer whose count is >= k."""
    out = []
    for p in range(NUNITS):
        mine = {c: n for (q, c), n in counts.items() if q == p and n > 0}
        for k in range(max(mine.values(), default=0)):
            mask = sum(1 << c for c, n in mine.items() if n > k)
            out.append(make(Opcode.SYNC, unit=p).with_tokens(0, mask))
    return out


COPY_CHUNK = 0x8000  # bytes per DMA row when copying a range between on-chip memory and DRAM


def copy_range(op: str, onchip: int, n: int, dram: int) -> list[Instr]:
    """The LOADs (restore) or STOREs (dump) that copy `n` bytes between on-chip address `onchip` and
    DRAM: one DMA row of at most `COPY_CHUNK` bytes each. The driver's dump and restore programs and
    the compiler's estimate of their cost both use it."""
    if op not in ("load", "store"):
        raise ValueError(f"copy_range copies with load or store, not {op!r}")
    out = []
    for off in range(0, n, COPY_CHUNK):
        cols = min(n - off, COPY_CHUNK)
        out.append(
            make(
                op, spad=onchip + off, dram=dram + off, rows=1, cols=cols, spad_stride=cols, dram_stride=cols
            )
        )
    return out


def _latest_conflict(hist: list[_Hist], floor: int, rs: list, ws: list) -> int:
    """The latest entry after `floor` that writes what this reads (`rs`) or touches what this
    writes (`ws`)."""
    for j in range(len(hist) - 1, floor, -1):
        h = hist[j]
        for sp, a, b, st, wd in ws:
            for s2, c, d, st2, wd2 in h.rw:
                if a < d and c < b and sp == s2 and not (st == st2 and strided_apart(a, wd, c, wd2, st)):
                    return j
        for sp, a, b, st, wd in rs:
            for s2, c, d, st2, wd2 in h.w:
                if a < d and c < b and sp == s2 and not (st == st2 and strided_apart(a, wd, c, wd2, st)):
                    return j
    return -1


def check_tokens(instrs: list[Instr], cfg: NpuConfig) -> None:
    """Check the static token rules: every pop follows a push in program order, no channel holds
    more than `token_depth` tokens, and none is outstanding at a fence or at the end (tokens may
    cross a cancellation point: a pause keeps them for the resume)."""
    count = {(p, c): 0 for p in range(NUNITS) for c in range(NUNITS) if p != c}
    for pc, ins in enumerate(instrs):
        u = ins.unit
        if u is not None:
            for p in range(NUNITS):
                if ins.wait >> p & 1:
                    count[(p, u)] -= 1
                    if count[(p, u)] < 0:
                        raise IsaError(
                            ErrorCode.DEADLOCK,
                            f"pc {pc}: pops a {Unit(p).name.lower()} token "
                            "that no earlier instruction pushed",
                        )
            for c in range(NUNITS):
                if ins.signal >> c & 1:
                    count[(u, c)] += 1
                    if count[(u, c)] > cfg.token_depth:
                        raise IsaError(
                            ErrorCode.TOKEN,
                            f"pc {pc}: more than {cfg.token_depth} tokens outstanding in one channel",
                        )
        elif ins.op in (Opcode.END, Opcode.FENCE) and any(count.values()):
            raise IsaError(ErrorCode.TOKEN, f"pc {pc}: {ins.op.name} with tokens outstanding")


def start_order(instrs: list[Instr], cfg: NpuConfig) -> list[int]:
    """A reordering of a run of unit instructions into the order they would start in with
    unbounded unit queues (indices into `instrs`), so that the in-order dispatcher meets each
    unit's instructions when that unit can take them: emitted band by band, the next band's loads
    sit behind this band's stores, which wait for its compute, and a full store queue then holds
    the dispatch of everything behind it.

    Start times come from the timing rules' durations (`npu.timing.duration`) and the conflicts the
    token assignment orders (`footprint`: a read after a write, a write after a read or a write of
    the same bytes by another unit). Sorting by start keeps every such pair in order (the consumer
    starts after its producer ends) and each unit's own order, so the program computes the same
    values. The micro core runs one instruction at a time: its order is kept."""
    if cfg.core == "micro":
        return list(range(len(instrs)))
    free = [0] * NUNITS
    done: list[list[tuple[int, list, list]]] = [[] for _ in range(NUNITS)]  # (end, writes, touches)
    starts = []
    for ins in instrs:
        u = int(ins.unit)
        rs, ws, rws = _span_tuples(ins)
        t = free[u]
        for p in range(NUNITS):
            if p == u:
                continue
            for end, w, rw in reversed(done[p]):  # ends grow along a unit: the latest conflict is it
                if end <= t:
                    break
                if _overlaps(ws, rw) or _overlaps(rs, w):
                    t = end
                    break
        end = t + duration(ins, cfg)
        free[u] = end
        done[u].append((end, ws, rws))
        starts.append(t)
    return sorted(range(len(instrs)), key=lambda i: (starts[i], i))


def _overlaps(a: list, b: list) -> bool:
    """Whether two lists of (space, start, end, stride, width) accesses may share a byte
    (`_latest_conflict` inlines the same test in its hot loop)."""
    for sp, s, e, st, wd in a:
        for s2, c, d, st2, wd2 in b:
            if s < d and c < e and sp == s2 and not (st == st2 and strided_apart(s, wd, c, wd2, st)):
                return True
    return False
