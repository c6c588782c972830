"""Operator order search.

Independent operators may run in any order, and the order changes how much of one operator's DMA
hides under another's compute (consecutive operators use opposite ends of the scratchpad, so the
program builder lets them overlap where their data do not conflict). The search:

1. finds the key nodes: operators that every input-to-output path passes (with any topological
   order, v is a key node exactly when no edge jumps over it);
2. cuts the graph after each key node into subgraphs and merges subgraphs smaller than
   `merge_below` operators into the one before (fewer, larger subgraphs: less linking work);
3. cuts a subgraph with more than `exhaustive_limit` orders into runs of fewer (`pieces`) and
   searches each subgraph's or run's topological orders exhaustively (random samples where a run
   cannot be cut that far), with the golden model's timing as the cost model (the program run
   alone, timing only); a best order is taken only where it saves `MIN_GAIN` of its subgraph's
   cycles, above the cost model's error;
4. links the best orders in subgraph sequence (subgraphs run one after another, so each can be
   optimised alone);
5. keeps the linked order only where the whole program in it is no slower than in the ONNX order
   (`whole_program`): each subgraph was timed alone, without what its neighbours and the
   cancellation points do at its ends.

With `objective="memory"` the cost is the peak of live activation bytes instead (as Serenity,
MLSys 2020, schedules for memory): each subgraph's candidate orders are those above plus the order
with the smallest peak found by dynamic programming over the sets of operators already run
(`dram.LiveMemory.best_order`). The linked order's lower bound is the largest subgraph peak, so
the search takes the smallest such bound reachable, then in every subgraph the fewest cycles among
the orders whose peak stays within it (ties by cycles).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from itertools import islice

from npu.arith import round_up
from npu.program import ProgramBuilder
from npu.sim.golden.model import BUSY_COUNTERS, NpuModel
from npu.sim.golden.runner import timing_run

from .assemble import Lowered, _estimate
from .dram import LiveMemory
from .lower import VIRTUAL_DRAM, Lowering
from .options import OBJECTIVES


def key_nodes(deps: list[set[int]]) -> list[int]:
    """Operators every path passes; `deps[i]` are the inputs of operator i, indices in a topological
    order (the ONNX order)."""
    n = len(deps)
    cover = [0] * (n + 1)
    for b, ds in enumerate(deps):
        for a in ds:
            if b - a > 1:  # the edge a -> b jumps over a+1 .. b-1
                cover[a + 1] += 1
                cover[b] -= 1
    keys, run = [], 0
    for v in range(n):
        run += cover[v]
        if run == 0:
            keys.append(v)
    return keys


def subgraphs(deps: list[set[int]], merge_below: int = 3) -> list[list[int]]:
    """Consecutive runs of operators cut after each key node; runs with fewer than `merge_below`
    operators are merged into the previous one."""
    keys = set(key_nodes(deps))
    groups: list[list[int]] = [[]]
    for v in range(len(deps)):
        groups[-1].append(v)
        if v in keys:
            groups.append([])
    groups = [g for g in groups if g]
    merged: list[list[int]] = []
    for g in groups:
        if merged and len(g) < merge_below:
            merged[-1].extend(g)
        else:
            merged.append(g)
    if len(merged) > 1 and len(merged[0]) < merge_below:
        merged[1] = merged[0] + merged[1]
        merged.pop(0)
    return merged


def topo_orders(nodes: list[int], deps: list[set[int]]) -> Iterator[list[int]]:
    """Every topological order of `nodes` (dependencies outside the set are satisfied), in the order
    a depth-first search taking the lowest position first finds them. Iterative: a subgraph may
    have thousands of operators (two branches of an unrolled bidirectional recurrent layer)."""
    inside = set(nodes)
    indeg = {v: len(deps[v] & inside) for v in nodes}
    users: dict[int, list[int]] = {v: [] for v in nodes}
    for v in nodes:
        for d in deps[v] & inside:
            users[d].append(v)
    order: list[int] = []
    placed: set[int] = set()
    n = len(nodes)

    def undo() -> None:
        v = order.pop()
        placed.discard(v)
        for u in users[v]:
            indeg[u] += 1

    pos = [0]  # per depth: the position in `nodes` to try next
    while pos:
        if len(order) == n:
            yield list(order)
            pos.pop()
            if order:
                undo()
            continue
        i = pos[-1]
        while i < n and (indeg[nodes[i]] != 0 or nodes[i] in placed):
            i += 1
        if i == n:  # this depth has no choice left: back to the one before
            pos.pop()
            if order:
                undo()
            continue
        pos[-1] = i + 1
        v = nodes[i]
        placed.add(v)
        order.append(v)
        for u in users[v]:
            indeg[u] -= 1
        pos.append(0)


def random_order(nodes: list[int], deps: list[set[int]], rng: random.Random) -> list[int]:
    inside = set(nodes)
    done: set[int] = set()
    order = []
    while len(order) < len(nodes):
        ready = [v for v in nodes if v not in done and deps[v] & inside <= done]
        v = rng.choice(ready)
        done.add(v)
        order.append(v)
    return order


class CostModel:
    """Cycles of a sequence of operators on the golden model (timing only), NPU operators alternating
    between the bottom and the top of the on-chip memories as in the final program."""

    def __init__(self, low: Lowering, cancel_points: bool = True):
        self.low = low
        self.cancel_points = cancel_points
        # a program that does not fit the real DRAM is refused after the search (compile_onnx)
        self.model = NpuModel(replace(low.cfg, dram_bytes=VIRTUAL_DRAM), timing_only=True)
        self.base = round_up(low.dram_end, 4096)
        self.evaluations = 0
        #: after `cycles`: the busiest unit's summed durations, which no order of the same operators
        #: goes below (each unit runs its instructions one at a time)
        self.floor = 0

    def cycles(self, order: list[int], parity: int = 0) -> int:
        total = 0
        self._busy = [0] * len(BUSY_COUNTERS)
        b = None
        k = parity
        for idx in order + [-1]:
            f = self.low.frags[idx] if idx >= 0 else None
            if f is not None and f.kind == "npu":
                b = b or ProgramBuilder(self.low.cfg)
                b.extend(f.placed(k % 2 == 1, self.low.cfg))
                if self.cancel_points:  # as in the final program: they constrain the tokens
                    b.cancel_point(k)
                k += 1
            elif (f is None or f.kind == "host") and b is not None:
                total += self._run(b)
                b = None
        self.evaluations += 1
        self.floor = max(self._busy)
        return total

    def _run(self, b: ProgramBuilder) -> int:
        counters = timing_run(self.low.cfg, b.build().instrs, self.base, self.model).counter_values()
        self._busy = [n + counters[c] for n, c in zip(self._busy, BUSY_COUNTERS.values(), strict=True)]
        return counters["CYCLES"]


@dataclass
class SubgraphResult:
    nodes: list[str]
    orders: int  # topological orders (counted up to the exhaustive limit + 1; streamed: those seen)
    evaluated: int
    method: str  # "exhaustive" | "sampled" | "single" | "budget"
    default_cycles: int  # 0 where not timed ("single": one order; "budget")
    best_cycles: int
    order: list[int]
    default_peak: int = 0  # most activation bytes live at once in the ONNX order / the chosen one
    best_peak: int = 0


@dataclass
class SearchResult:
    order: list[int]
    subgraphs: list[SubgraphResult] = field(default_factory=list)
    search_s: float = 0.0
    timed_out: bool = False
    objective: str = "cycles"
    #: (the whole program's cycles in the searched order, in the ONNX order) where the two differ
    #: and both were timed (`whole_program`); the ONNX order is kept where it is faster
    whole: tuple[int, int] | None = None

    @property
    def kept_onnx(self) -> bool:
        return self.whole is not None and self.whole[1] < self.whole[0]

    @property
    def peak(self) -> int:
        """The chosen order's lower bound: the largest subgraph peak."""
        return max((s.best_peak for s in self.subgraphs), default=0)

    @property
    def predicted_gain(self) -> int:
        return sum(s.default_cycles - s.best_cycles for s in self.subgraphs)


#: a subgraph's best order is taken over the ONNX order only when the cost model says it saves at
#: least this share of the subgraph's cycles: the subgraph timed alone misses what its neighbours and
#: the final program's cancellation points do at its ends, by 0.1-0.2 % of its cycles on the real
#: models, where smaller predicted gains came out as losses in the final program (docs/compiler.md)
MIN_GAIN = 0.005


def search_order(
    low: Lowering,
    *,
    partition: bool = True,
    exhaustive_limit: int | None = 120,
    samples: int = 40,
    merge_below: int = 3,
    budget_s: float | None = 30.0,
    seed: int = 0,
    cancel_points: bool = True,
    objective: str = "cycles",
    max_states: int = 50_000,
    min_gain: float = MIN_GAIN,
) -> SearchResult:
    """The best operator order found (see the module docstring); `partition=False` searches the
    whole graph as one subgraph; `exhaustive_limit=None` enumerates every order (until the budget).
    With `budget_s`, each subgraph is searched for its share of the time left, by its claim
    (`_claims`: its estimated cycles); subgraphs left unsearched when time runs out keep their ONNX
    order (the result says `timed_out`). `objective`: "cycles" or "memory" (peak live activation
    bytes, ties by cycles; `max_states` bounds its dynamic programming per subgraph). `min_gain`:
    the least share of a subgraph's cycles its best order must save to be taken (MIN_GAIN)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be 'cycles' or 'memory', not {objective!r}")
    t0 = time.perf_counter()
    deps = [f.deps for f in low.frags]
    groups = subgraphs(deps, merge_below) if partition else [list(range(len(deps)))]
    cost = CostModel(low, cancel_points)
    mem = LiveMemory(low)
    rng = random.Random(seed)
    if objective == "memory":
        args = (budget_s, exhaustive_limit, samples, max_states)
        return _search_memory(low, groups, deps, cost, mem, rng, t0, *args)
    res = SearchResult([])
    parity = 0
    claims = _claims(low, groups, deps)
    left = sum(claims)
    for g, claim in zip(groups, claims, strict=True):
        parts, scale, timed, end = [g], None, None, None
        if budget_s is not None:  # this subgraph's share of the time left, by its claim
            now, stop = time.perf_counter(), t0 + budget_s
            end = now + max(stop - now, 0.0) * claim / left if left else stop
            left -= claim
        if budget_s is None or time.perf_counter() - t0 <= budget_s:
            args = (exhaustive_limit, samples, budget_s, merge_below)
            parts, scale, timed = _runs(g, deps, cost, parity, *args)
        for part in parts:
            if end is not None and time.perf_counter() > end and claim:
                pk = mem.peak(part, part)
                res.subgraphs.append(SubgraphResult(_names(low, part), 0, 0, "budget", 0, 0, part, pk, pk))
                res.timed_out = True
            else:
                r = _search_subgraph(
                    low, part, deps, cost, mem, rng, parity, exhaustive_limit, samples, end, min_gain, scale,
                    timed if part is g else None,
                )  # fmt: skip
                res.subgraphs.append(r)
            res.order += res.subgraphs[-1].order
            parity += sum(low.frags[v].kind == "npu" for v in part)
    res.search_s = time.perf_counter() - t0
    return res


def whole_program(
    search: SearchResult, operators: int, build: Callable[[list[int] | None], Lowered]
) -> Lowered:
    """The program `build(order)` assembles in the searched order, or in the ONNX order (None) where
    the order search changed it and the whole program is faster so (golden-model cycles of its NPU
    segments); `search.whole` records both, and a kept ONNX order becomes `search.order`. The memory
    objective's order is taken as it is (its peak is the point, not its cycles)."""
    onnx = list(range(operators))
    low = build(search.order)
    if search.objective != "cycles" or search.order == onnx:
        return low
    first = build(None)
    search.whole = (low.npu_cycles, first.npu_cycles)
    if search.kept_onnx:
        search.order = onnx
        return first
    return low


def _claims(low: Lowering, groups: list[list[int]], deps: list[set[int]]) -> list[int]:
    """Each subgraph's claim on the search's time: its operators' estimated cycles (each one's
    busiest unit's summed durations), where it has an order to choose; none where it has one.
    Shares by claim let every subgraph of an Inception-style net be searched within the budget,
    where the first ones took it all (docs/compiler.md)."""
    cfg = low.cfg
    out = []
    for g in groups:
        if len(list(islice(topo_orders(g, deps), 2))) < 2:
            out.append(0)
            continue
        npu = [low.frags[v] for v in g if low.frags[v].kind == "npu"]
        total = sum(_estimate([it.instr for it in f.items if it.kind == "instr"], cfg)[2] for f in npu)
        out.append(max(total, 1))
    return out


def _runs(g, deps, cost: CostModel, parity: int, limit: int | None, samples: int, budget_s: float | None,
          least: int) -> tuple[list[list[int]], int | None, tuple[int, int] | None]:  # fmt: skip
    """How subgraph `g` is searched: whole (its orders enumerated, or sampled), or cut into runs
    (`pieces`) where sampling it would take more than the whole search's budget: `samples` timings
    of the whole subgraph (2.5 s each on the PP-OCRv4 detector's 201 operators, 10 ms on an
    Inception module). With runs, the cycles a gain is judged against: the whole subgraph's (the cost
    model's error is at its ends and the final program's points, not at the cuts; MIN_GAIN); kept
    whole after that timing, its cycles and floor (not timed again)."""
    if limit is None or budget_s is None or len(list(islice(topo_orders(g, deps), limit + 1))) <= limit:
        return [g], None, None
    t = time.perf_counter()
    whole = cost.cycles(g, parity)
    if (time.perf_counter() - t) * samples <= budget_s:
        return [g], None, (whole, cost.floor)
    return pieces(g, deps, limit, least), whole, None


def pieces(g: list[int], deps: list[set[int]], limit: int, least: int = 3) -> list[list[int]]:
    """Subgraph `g` (operators in ONNX order) cut into consecutive runs of at least `least`
    operators, each with at most `limit` topological orders where cuts allow: a subgraph with more
    is cut where the fewest dependencies cross (ties: nearest the middle), again and again. Orders
    within the runs keep every dependency (runs go one after another), and each run is searched
    exhaustively, each order timed on the run alone. (Orders across the cuts are lost: an Inception
    module's best orders interleave its branches, which runs cannot; docs/compiler.md.)"""
    if len(g) < 2 * least or len(list(islice(topo_orders(g, deps), limit + 1))) <= limit:
        return [g]
    pos = {v: i for i, v in enumerate(g)}
    delta = [0] * (len(g) + 1)  # dependencies crossing the cut before position i, as differences
    for v in g:
        for d in deps[v]:
            if d in pos:
                delta[pos[d] + 1] += 1
                delta[pos[v] + 1] -= 1
    crossing, best = 0, None
    for i in range(1, len(g)):
        crossing += delta[i]
        if least <= i <= len(g) - least and (best is None or (crossing, abs(len(g) - 2 * i)) < best[0]):
            best = ((crossing, abs(len(g) - 2 * i)), i)
    assert best is not None  # len(g) >= 2 * least: some cut qualifies
    i = best[1]
    return pieces(g[:i], deps, limit, least) + pieces(g[i:], deps, limit, least)


def _search_subgraph(
    low: Lowering, g: list[int], deps, cost: CostModel, mem: LiveMemory, rng: random.Random, parity: int,
    exhaustive_limit: int | None, samples: int, budget_end: float | None = None, min_gain: float = 0.0,
    scale: int | None = None, timed: tuple[int, int] | None = None,
) -> SubgraphResult:  # fmt: skip
    """The fewest cycles among `g`'s orders: all of them up to `exhaustive_limit`, else `samples`
    random ones (`exhaustive_limit` None: every order, until `budget_end`); taken only where they
    save `min_gain` of `scale` cycles (default: `g`'s own), else the ONNX order. None is timed
    past the ONNX order's where even the busiest unit's floor leaves less to gain. `timed`: the ONNX
    order's cycles and floor, where known."""
    # the orders themselves (up to the limit, so that counting and searching enumerate once), or
    # with no limit a stream searched until the budget runs out
    n = None
    if exhaustive_limit is None:
        cands, method = topo_orders(g, deps), "exhaustive"
    else:
        head = list(islice(topo_orders(g, deps), exhaustive_limit + 1))
        n = len(head)
        if n <= exhaustive_limit:
            cands, method = head, "exhaustive" if n > 1 else "single"
        else:
            cands, method = _sampled(g, deps, samples, rng), "sampled"
    if method == "single":  # nothing to choose: not timed (a chain is most subgraphs of a CNN)
        pk = mem.peak(g, g)
        return SubgraphResult(_names(low, g), 1, 0, method, 0, 0, g, pk, pk)
    default, floor = timed or (cost.cycles(g, parity), cost.floor)
    need = min_gain * (scale or default)
    if default - floor < need:  # no order of these operators can save enough
        cands, method = [], f"{method} (not searched: at most {default - floor} cycles to gain)"
    best, best_c, seen, evaluated = g, default, 1, 1
    for cand in cands:
        if cand == g:
            continue
        if budget_end is not None and evaluated > 1 and time.perf_counter() > budget_end:
            method += " (its share of the budget)"
            break
        seen += 1
        c = cost.cycles(cand, parity)
        evaluated += 1
        if c < best_c:
            best, best_c = cand, c
    if best is not g and default - best_c < need:
        method += f" (ONNX order kept: {default - best_c} cycles, below {min_gain:.1%} of {scale or default})"
        best, best_c = g, default
    window = mem.window(g)
    return SubgraphResult(
        _names(low, g), seen if n is None else n, evaluated, method, default, best_c, best,
        mem.peak(g, g, window), mem.peak(g, best, window),
    )  # fmt: skip


def _search_memory(
    low, groups, deps, cost, mem, rng, t0, budget_s, exhaustive_limit, samples, max_states
) -> SearchResult:
    """The memory objective (module docstring): peaks of every candidate first (cheap), then the
    golden model's cycles among the candidates within the bound, while the budget lasts."""
    res = SearchResult([], objective="memory")
    plans = []  # per subgraph: candidates (the ONNX order first), their peaks, method, order count
    for g in groups:
        window = mem.window(g)
        limit = 10_000 if exhaustive_limit is None else exhaustive_limit
        head = list(islice(topo_orders(g, deps), limit + 1))
        if len(head) <= limit:
            cands, method = head, "exhaustive" if len(head) > 1 else "single"
        else:
            cands, method = list(_sampled(g, deps, samples, rng)), "sampled"
        best = mem.best_order(g, deps, max_states) if len(head) > 1 else None
        if best is not None and method == "sampled":
            method = "sampled + min-peak"
        cands = [g] + [c for c in cands + ([best[0]] if best else []) if c != g]
        uniq = list(dict.fromkeys(tuple(c) for c in cands))
        peaks = [mem.peak(g, list(c), window) for c in uniq]
        plans.append(([list(c) for c in uniq], peaks, method, len(head)))
    bound = max((min(p) for _, p, _, _ in plans), default=0)
    parity = 0
    for g, (cands, peaks, method, n) in zip(groups, plans, strict=True):
        n_npu = sum(low.frags[v].kind == "npu" for v in g)
        within = sorted((p, i) for i, p in enumerate(peaks) if p <= bound)
        out_of_time = budget_s is not None and time.perf_counter() - t0 > budget_s
        if out_of_time:  # no cycles: the smallest peak
            res.timed_out = True
            i = within[0][1]
            res.subgraphs.append(
                SubgraphResult(_names(low, g), n, 0, method + " (budget)", 0, 0, cands[i], peaks[0], peaks[i])
            )
            res.order += cands[i]
            parity += n_npu
            continue
        default = cost.cycles(g, parity)
        best_key, best_i, evaluated = None, None, 1
        for p, i in within:
            c = default if i == 0 else cost.cycles(cands[i], parity)
            evaluated += i != 0
            if best_key is None or (c, p) < best_key:
                best_key, best_i = (c, p), i
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                res.timed_out = True
                method += " (budget)"
                break
        res.subgraphs.append(
            SubgraphResult(
                _names(low, g),
                n,
                evaluated,
                method,
                default,
                best_key[0],
                cands[best_i],
                peaks[0],
                peaks[best_i],
            )
        )
        res.order += cands[best_i]
        parity += n_npu
    res.search_s = time.perf_counter() - t0
    return res


def _sampled(nodes, deps, count, rng) -> Iterator[list[int]]:
    seen = set()
    for _ in range(count * 4):
        o = random_order(nodes, deps, rng)
        if tuple(o) not in seen:
            seen.add(tuple(o))
            yield o
        if len(seen) >= count:
            return


def _names(low: Lowering, g: list[int]) -> list[str]:
    return [low.frags[v].layer.node for v in g]
