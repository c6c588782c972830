"""DRAM planning: constants packed, activations sharing one arena by liveness.

Lowering places every tensor at its own DRAM range (a bump allocator: the *virtual* layout, which
the order search's cost model also runs with). Once an operator order is chosen, `plan` gives every
range its final address:

* **Constants** (weights, biases) are packed first, from `BASE`, in lowering order.
* **Activations** share one arena after them: every quantised tensor the NPU program or a host step
  reads or writes in DRAM, graph inputs and DRAM-resident graph outputs included. A tensor is live
  from its first access to its last, in the chosen order: graph inputs from before the first
  segment (the host writes them when a job starts), graph outputs until after the last one (the
  host reads them when the job ends). Two tensors may share bytes only when one's accesses all
  finish before the other's begin. Offsets come from the greedy-by-size assignment of TFLite's arena
  planner: tensors by size, largest first (ties: first use), each at the lowest offset that overlaps
  no tensor already placed whose lifetime intersects its own.
* With `granularity="operator"` the driver may run independent operators of one job in any order
  or at once on several engines, so "before" is the operator graph's partial order: a tensor may
  reuse another's bytes only when every operator touching the first is an ancestor (through the
  data dependencies the driver follows) of every operator touching the second.

Every access of the program is translated by the range it falls in (LOAD/STORE `dram` fields, host
step tensors, inputs, outputs, constant images); an access that crosses ranges is an internal error.
Reusing a range adds write-after-read dependencies, which the program builder turns into tokens as
for any other DRAM conflict. Cancellation points need nothing more: a paused job's tensors stay in its
own DRAM (another job of the model takes another instance), and a tensor live across a point is live
at that place in the order.

`lower_bound` is the largest number of activation bytes live at once for an order (no placement
can use less); `LiveMemory` evaluates it per subgraph for the order search's memory objective.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from npu.arith import round_up
from npu.container import HostIO, HostStep, TensorDesc
from npu.isa import Opcode, extent
from npu.program import Item

from .options import DRAM_PLANS

if TYPE_CHECKING:
    from .lower import Lowering

ALIGN = 64  # DMA rows and tensor layouts: every range starts on a 64-byte boundary (as lowering's)
BASE = 0x1000  # the first DRAM byte a model uses
START, END = -1, -2  # pseudo accessors: the host writing inputs, the host reading outputs


@dataclass(frozen=True)
class Buffer:
    """One DRAM range of the virtual layout: [addr, addr + size), size a multiple of ALIGN."""

    addr: int
    size: int
    kind: str  # "const" | "act"
    what: str


@dataclass
class DramPlan:
    """Where everything went and what it costs. Byte figures count whole ALIGN-byte slots."""

    mode: str  # "arena" | "bump" (every range at its virtual address: the old allocator)
    granularity: str
    const_bytes: int  # constants, packed
    arena_base: int
    arena_bytes: int  # the arena's peak (highest end - base); bump mode: bump_bytes
    lower_bound: int  # most activation bytes live at once in the chosen order
    bump_bytes: int  # activations with one range each (what the bump allocator takes)
    dram_end: int  # first byte after constants and activations
    tensors: int  # activation ranges planned
    addrs: dict[int, int] = field(default_factory=dict, repr=False)  # buffer index -> final address
    lifetimes: dict[int, tuple[int, int]] = field(default_factory=dict, repr=False)  # chain steps

    def describe(self) -> str:
        if self.mode == "bump":
            return (
                f"DRAM: {self.tensors} activations with one range each: {self.bump_bytes} bytes "
                f"(at least {self.lower_bound} live at once in this order); constants "
                f"{self.const_bytes} bytes (--dram bump)"
            )
        order = "the operator graph's partial order" if self.granularity == "operator" else "this order"
        return (
            f"DRAM: {self.tensors} activations share an arena of {self.arena_bytes} bytes at "
            f"0x{self.arena_base:x} (lower bound {self.lower_bound}: the most live at once in the "
            f"chosen order; one range each would take {self.bump_bytes}; lifetimes over {order}); "
            f"constants {self.const_bytes} bytes"
        )


# -- what each operator touches -------------------------------------------------------------------


class Buffers:
    """The virtual ranges of a lowering and which operators touch each (computed once per lowering)."""

    def __init__(self, low: Lowering):
        self.buffers: list[Buffer] = low.buffers
        self.starts = [b.addr for b in self.buffers]
        self.low = low
        n = len(self.buffers)
        self.users: list[set[int]] = [set() for _ in range(n)]  # frag indices, START, END
        for f in low.frags:
            for b in self._frag_buffers(f):
                self.users[b].add(f.index)
        for t in low.inputs:
            if isinstance(t, TensorDesc):
                self.users[self.find(t.addr, t.layout.nbytes)].add(START)
        for t in low.outputs:
            if isinstance(t, TensorDesc):
                self.users[self.find(t.addr, t.layout.nbytes)].add(END)
        self.acts = [i for i, b in enumerate(self.buffers) if b.kind == "act"]

    def find(self, addr: int, nbytes: int = 1) -> int:
        """The range holding [addr, addr + nbytes); an access crossing ranges is an internal error."""
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0 or addr + max(nbytes, 1) > self.starts[i] + self.buffers[i].size:
            raise AssertionError(f"DRAM access [0x{addr:x}, +{nbytes}) is not inside one planned range")
        return i

    def _frag_buffers(self, f) -> set[int]:
        out: set[int] = set()
        if f.kind == "npu":
            for it in f.items:
                if it.kind == "instr" and it.instr.op in (Opcode.LOAD, Opcode.STORE):
                    x = it.instr.fields
                    s, e = extent(x["dram"], x["rows"], x["cols"], x["dram_stride"])
                    if e > s:
                        out.add(self.find(s, e - s))
        elif f.kind == "host":
            for io in f.host.inputs + f.host.quantize:
                if io.tensor is not None:
                    out.add(self.find(io.tensor.addr, io.tensor.layout.nbytes))
        return out


def buffers_of(low: Lowering) -> Buffers:
    if low._buffers is None:
        low._buffers = Buffers(low)
    return low._buffers


# -- lifetimes ------------------------------------------------------------------------------------


def lifetimes(bufs: Buffers, order: list[int]) -> dict[int, tuple[int, int]]:
    """[first, last] step of every activation in `order` (steps 0..n-1; inputs from -1, outputs to n)."""
    pos = {f: i for i, f in enumerate(order)}
    pos[START], pos[END] = -1, len(order)
    out = {}
    for b in bufs.acts:
        steps = [pos[u] for u in bufs.users[b]] or [-1]
        out[b] = (min(steps), max(steps))
    return out


def lower_bound(bufs: Buffers, life: dict[int, tuple[int, int]], n: int) -> int:
    """The most activation bytes live at once (each tensor over [first, last] step)."""
    diff = [0] * (n + 3)
    for b, (lo, hi) in life.items():
        diff[lo + 1] += bufs.buffers[b].size
        diff[hi + 2] -= bufs.buffers[b].size
    peak = run = 0
    for d in diff:
        run += d
        peak = max(peak, run)
    return peak


def _ancestors(low: Lowering) -> list[int]:
    """Per fragment, a bit set of its strict ancestors through data dependencies (bit n: START)."""
    n = len(low.frags)
    anc = [0] * n
    for f in low.frags:  # the ONNX order is topological
        a = 1 << n
        for d in f.deps:
            a |= anc[d] | 1 << d
        anc[f.index] = a
    return anc


def _before_sets(bufs: Buffers, acts: list[int]) -> tuple[dict[int, int], dict[int, int]]:
    """For the operator graph's partial order: per tensor, the bit set of its accessors and of the
    nodes that precede every one of its accessors (START is bit n; END has every node before it)."""
    n = len(bufs.low.frags)
    anc = _ancestors(bufs.low)
    everything = (1 << (n + 1)) - 1
    node = {START: 0, END: everything}
    users, common = {}, {}
    for b in acts:
        m, c = 0, everything
        for u in bufs.users[b]:
            m |= 1 << {START: n, END: n + 1}.get(u, u)
            c &= node[u] if u in node else anc[u]
        users[b], common[b] = m, c
    return users, common


# -- placement ------------------------------------------------------------------------------------


def greedy_by_size(sizes: dict[int, int], first: dict[int, int], conflict) -> dict[int, int]:
    """TFLite's greedy-by-size offsets: largest first (ties: first use, then index), each at the
    lowest ALIGN-aligned offset clear of every placed tensor it `conflict`s with."""
    placed: list[tuple[int, int, int]] = []  # offset, end, tensor
    out = {}
    for b in sorted(sizes, key=lambda b: (-sizes[b], first[b], b)):
        busy = sorted((s, e) for s, e, o in placed if conflict(b, o))
        off = 0
        for s, e in busy:
            if off + sizes[b] <= s:
                break
            off = max(off, e)
        off = round_up(off, ALIGN)
        out[b] = off
        placed.append((off, off + sizes[b], b))
    return out


def plan(low: Lowering, order: list[int], granularity: str = "segment", mode: str = "arena") -> DramPlan:
    """Final DRAM addresses for `order` (see the module docstring)."""
    if mode not in DRAM_PLANS:
        raise ValueError(f"dram plan must be 'arena' or 'bump', not {mode!r}")
    bufs = buffers_of(low)
    life = lifetimes(bufs, order)
    lb = lower_bound(bufs, life, len(order))
    acts = bufs.acts
    bump = sum(bufs.buffers[b].size for b in acts)
    consts = [i for i, b in enumerate(bufs.buffers) if b.kind == "const"]
    const_bytes = sum(bufs.buffers[i].size for i in consts)
    if mode == "bump":
        addrs = {i: b.addr for i, b in enumerate(bufs.buffers)}
        return DramPlan(
            mode, granularity, const_bytes, BASE, bump, lb, bump, low.dram_end, len(acts), addrs, life
        )
    addrs, at = {}, BASE
    for i in consts:
        addrs[i] = at
        at += bufs.buffers[i].size
    base = round_up(at, ALIGN)
    sizes = {b: bufs.buffers[b].size for b in acts}
    first = {b: life[b][0] for b in acts}
    if granularity == "operator":
        users, common = _before_sets(bufs, acts)

        def conflict(a: int, b: int) -> bool:
            return bool(users[a] & ~common[b]) and bool(users[b] & ~common[a])
    else:

        def conflict(a: int, b: int) -> bool:
            return life[a][0] <= life[b][1] and life[b][0] <= life[a][1]

    offs = greedy_by_size(sizes, first, conflict)
    peak = max((offs[b] + sizes[b] for b in acts), default=0)
    for b in acts:
        addrs[b] = base + offs[b]
    return DramPlan(mode, granularity, const_bytes, base, peak, lb, bump, base + peak, len(acts), addrs, life)


# -- applying a plan ------------------------------------------------------------------------------


class Translate:
    """Virtual DRAM address -> planned address, by the range it falls in."""

    def __init__(self, low: Lowering, p: DramPlan):
        self.bufs = buffers_of(low)
        self.delta = [p.addrs[i] - b.addr for i, b in enumerate(self.bufs.buffers)]
        self.identity = not any(self.delta)

    def addr(self, a: int, nbytes: int = 1) -> int:
        return a + self.delta[self.bufs.find(a, nbytes)]

    def items(self, items: list[Item]) -> list[Item]:
        if self.identity:
            return items
        out = []
        for it in items:
            if it.kind == "instr" and it.instr.op in (Opcode.LOAD, Opcode.STORE):
                x = it.instr.fields
                s, e = extent(x["dram"], x["rows"], x["cols"], x["dram_stride"])
                d = self.delta[self.bufs.find(s, e - s)] if e > s else 0
                if d:
                    ins = dataclasses.replace(it.instr, fields={**x, "dram": x["dram"] + d})
                    it = dataclasses.replace(it, instr=ins)
            out.append(it)
        return out

    def desc(self, t):
        if not isinstance(t, TensorDesc) or self.identity:
            return t
        return dataclasses.replace(t, addr=self.addr(t.addr, t.layout.nbytes))

    def host(self, h: HostStep) -> HostStep:
        def io(x: HostIO) -> HostIO:
            return dataclasses.replace(x, tensor=self.desc(x.tensor)) if x.tensor is not None else x

        return dataclasses.replace(h, inputs=[io(x) for x in h.inputs], quantize=[io(x) for x in h.quantize])


# -- the order search's memory objective ----------------------------------------------------------


class LiveMemory:
    """Peak live activation bytes of subgraph orders, for the order search (order.py). Subgraphs are
    consecutive runs of the ONNX order that the final order links in sequence, so a tensor touched
    before a subgraph (or a graph input) is live from its start, one touched after it (or a graph
    output) until its end, and the lower bound of the linked order is the largest subgraph peak."""

    def __init__(self, low: Lowering):
        self.bufs = buffers_of(low)

    def window(self, g: list[int]) -> tuple[int, list[tuple[int, list[int], bool, bool]]]:
        lo, hi = min(g), max(g)
        const, rel = 0, []
        for b in self.bufs.acts:
            us = self.bufs.users[b]
            inside = [u for u in us if u >= 0 and lo <= u <= hi]
            before = any(u == START or 0 <= u < lo for u in us)
            after = any(u == END or u > hi for u in us)
            if inside:
                rel.append((self.bufs.buffers[b].size, inside, before, after))
            elif before and after:
                const += self.bufs.buffers[b].size
        return const, rel

    def peak(self, g: list[int], order: list[int], window=None) -> int:
        """The most live bytes while the subgraph `g` runs in `order`."""
        const, rel = window or self.window(g)
        pos = {v: i for i, v in enumerate(order)}
        n = len(order)
        diff = [0] * (n + 1)
        for size, inside, before, after in rel:
            ps = [pos[u] for u in inside]
            diff[0 if before else min(ps)] += size
            diff[n if after else max(ps) + 1] -= size
        peak = run = 0
        for d in diff[:n]:
            run += d
            peak = max(peak, run)
        return const + peak

    def best_order(
        self, g: list[int], deps: list[set[int]], max_states: int = 50_000
    ) -> tuple[list[int], int] | None:
        """An order of `g` with the smallest peak, by dynamic programming over the sets of operators
        already run (Serenity, MLSys 2020); None when there are more than `max_states` such sets."""
        const, rel = self.window(g)
        n = len(g)
        idx = {v: i for i, v in enumerate(g)}
        pred = [sum(1 << idx[d] for d in deps[v] if d in idx) for v in g]
        masks = [(size, sum(1 << idx[u] for u in us), before, after) for size, us, before, after in rel]
        full = (1 << n) - 1
        best: dict[int, tuple[int, int, int]] = {0: (0, -1, -1)}  # set -> (peak, previous set, op)
        layer = [0]
        for _ in range(n):
            nxt: dict[int, tuple[int, int, int]] = {}
            for s in layer:
                pk = best[s][0]
                rest = full & ~s
                for i in range(n):
                    if s >> i & 1 or pred[i] & ~s:
                        continue
                    t = s | 1 << i
                    live = const
                    for size, m, before, after in masks:
                        if (before or m & t) and (after or m & rest):
                            live += size
                    p = max(pk, live)
                    if t not in nxt or p < nxt[t][0]:
                        nxt[t] = (p, s, i)
            best.update(nxt)
            if len(best) > max_states:
                return None
            layer = list(nxt)
        order, s = [], full
        while s:
            _, prev, i = best[s]
            order.append(g[i])
            s = prev
        return order[::-1], best[full][0]
