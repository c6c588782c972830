"""Assembly and linking: an operator order becomes NPU program segments and host steps, with the
cancellation points the policy chooses, each layer's pc range and cost figures, and the point table.

Consecutive NPU operators alternate between the bottom and the top of the on-chip memories (so
independent operators can overlap); a host step ends the current NPU segment.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from npu.config import ACC_BASE, NpuConfig
from npu.container import CancelPoint, HostTensor, Layer, NpuSegment, Segment, TensorDesc
from npu.isa import Instr, Opcode, footprint
from npu.program import BuiltProgram, Item, ProgramBuilder, start_order
from npu.sim.golden.runner import UNIT_EVENTS, first_starts_after, timing_run
from npu.timing import dma_bytes, duration

from .dram import DramPlan, Translate, plan
from .lower import Lowering
from .options import GRANULARITIES
from .points import SPILL_POINTS, Candidate, PointPolicy, choose, dma_cycles, fragment_liveness


@dataclass
class Lowered:
    program: list[Instr]
    dram: list[tuple[int, bytes]]  # constant images (weights, biases)
    inputs: list[TensorDesc]
    outputs: list[TensorDesc | HostTensor]
    segments: list[Segment]
    layers: list[Layer] = field(default_factory=list)
    host_models: dict[str, bytes] = field(default_factory=dict)
    dram_end: int = 0
    order: list[int] = field(default_factory=list)  # fragment indices in program order
    dram_plan: DramPlan | None = None  # where constants and activations went (compiler/dram.py)
    points: list[CancelPoint] = field(default_factory=list)  # the cancellation point table
    candidates: list[dict] = field(default_factory=list)  # every place a point could have gone
    #: the NPU segments' golden-model cycles built without their points (where the points were
    #: placed on that timing: with an interval), None where not timed; what the points cost
    cycles_without_points: int | None = 0

    @property
    def npu_cycles(self) -> int:
        """The NPU segments' golden-model cycles (the cost model's), points included."""
        return sum(s.est_cycles or 0 for s in self.segments if isinstance(s, NpuSegment))

    @property
    def cancel_points(self) -> dict[int, int]:
        """Point id -> pc."""
        return {p.id: p.pc for p in self.points}


@dataclass
class Reuse:
    """What an assembly without timing (the accuracy guard's build) leaves to a timed one of the
    same lowering, order and options: each NPU segment's build without points (`builds`, by the
    segment's ordinal among the NPU segments), which is the timed assembly's first build, and
    `times(k)`: the golden model's unit end times per pc of segment k's build and its cycles, timed
    elsewhere (compiler/parallel.py), or None where they are not there."""

    low: Lowering | None = None
    order: list[int] = field(default_factory=list)
    options: tuple = ()
    builds: dict[int, tuple[int, BuiltProgram, dict[int, int]]] = field(default_factory=dict)
    times: Callable[[int], tuple[dict[int, int], int] | None] = lambda _k: None

    def fits(self, low: Lowering, order: list[int], options: tuple) -> bool:
        return self.low is low and self.order == order and self.options == options


def _estimate(
    instrs: list[Instr], cfg: NpuConfig, durations: list[int] | None = None
) -> tuple[int, int, int]:
    """Cost-model figures of an instruction range: compute and DMA busy cycles and a runtime estimate
    (`durations`: the instructions' `duration`s, where the caller has them)."""
    busy = {"load": 0, "matrix": 0, "vector": 0, "store": 0}
    durations = (
        [duration(i, cfg) if i.unit is not None else 0 for i in instrs] if durations is None else durations
    )
    for i, d in zip(instrs, durations, strict=True):
        if i.unit is not None:
            busy[i.unit.name.lower()] += d
    compute = max(busy["matrix"], busy["vector"])
    dma = busy["load"] + busy["store"]
    return compute, dma, max(compute, busy["load"], busy["store"])


def _onchip_extent(instrs: list[Instr]) -> tuple[int, int]:
    """Bytes of scratchpad and of accumulators the instructions touch: highest end minus lowest
    start in each memory (an operator placed at the top of a region still counts what it uses)."""
    ext = {False: [1 << 30, 0], True: [1 << 30, 0]}  # in the accumulators? -> [lowest, highest]
    for i in instrs:
        reads, writes = footprint(i)
        for sp in reads + writes:
            if sp.space == "onchip":
                e = ext[sp.start >= ACC_BASE]
                e[0], e[1] = min(e[0], sp.start), max(e[1], sp.end)
    return tuple(max(0, hi - lo) for lo, hi in (ext[False], ext[True]))  # type: ignore[return-value]


def segment_figures(
    instrs: list[Instr], cfg: NpuConfig, durations: list[int] | None = None
) -> dict[str, int]:
    """A segment's on-chip footprint, DRAM traffic and cost-model cycles (NpuSegment's fields)."""
    compute, dma, est = _estimate(instrs, cfg, durations)
    spad, acc = _onchip_extent(instrs)
    rd = wr = 0
    for i in instrs:
        r, w = dma_bytes(i)
        rd, wr = rd + r, wr + w
    return dict(
        est_cycles=est,
        spad_bytes=spad,
        acc_bytes=acc,
        dma_rd_bytes=rd,
        dma_wr_bytes=wr,
        dma_cycles=dma,
        compute_cycles=compute,
    )


def assemble(
    low: Lowering,
    order: list[int] | None = None,
    policy: PointPolicy | None = SPILL_POINTS,
    granularity: str = "segment",
    dram: str = "arena",
    step_cycles: int = 0,
    timed: bool = True,
    reuse: Reuse | None = None,
) -> Lowered:
    """Programs and host steps for one operator order (a topological order of the fragments), with
    cancellation points placed by `policy` (None: no points). `granularity` "operator" makes every
    operator its own segment and records which segments each one reads from (the operator graph);
    "step" also cuts each operator, between its steps, into segments of about `step_cycles` (cost
    model): a segment after a cut that leaves on-chip data is `chained`, it continues on the data of
    the one before, whose end point records that data as live.
    `dram`: "arena" (activations share one arena by liveness in this order) or "bump" (every tensor
    at its own range, the addresses lowering gave). Not `timed`: the cost figures (segments', layers',
    points') are the busiest unit's summed durations, not the golden model's timing (for a build
    whose values alone matter). `reuse`: not `timed`, filled with each NPU segment's build without
    points; `timed`, taken from where it fits (the same lowering, order and options)."""
    order = list(range(len(low.frags))) if order is None else order  # default: the ONNX order
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}, not {granularity!r}")
    if granularity == "step" and step_cycles <= 0:
        raise ValueError(f"granularity 'step' needs step_cycles > 0, not {step_cycles}")
    cfg = low.cfg
    pos = {f: i for i, f in enumerate(order)}
    if sorted(order) != list(range(len(low.frags))):
        raise ValueError("the order must name every operator once")
    for f in low.frags:
        for d in f.deps:
            if pos[d] > pos[f.index]:
                raise ValueError(
                    f"operator {f.layer.node} is ordered before its input {low.frags[d].layer.node}"
                )
    if reuse is not None:
        options = (granularity, dram, step_cycles)
        if not timed:  # filled by this assembly
            reuse.low, reuse.order, reuse.options = low, list(order), options
        elif not reuse.fits(low, order, options):  # left by an assembly of something else
            reuse = None
    dp = plan(low, order, granularity, dram)
    tr = Translate(low, dp)  # virtual DRAM addresses -> planned ones, applied before building
    out = Lowered(
        [],
        [(tr.addr(a, len(d)), d) for a, d in low.dram],
        [tr.desc(t) for t in low.inputs],
        [tr.desc(t) for t in low.outputs],
        [],
        [],
        {},
        dp.dram_end,
        list(order),
        dram_plan=dp,
    )
    seg: list = []  # items of the NPU segment being collected
    cands: list[Candidate] = []
    spans: list[tuple[dict, int, int]] = []  # layer, first item, end item
    k_npu = 0
    n_segs = 0  # NPU segments emitted (the next one's ordinal, `Reuse.builds`' key)
    seg_of: dict[int, int] = {}  # fragment -> segment holding it (its last, when cut into steps)
    first_of: dict[int, int] = {}  # fragment -> its first segment (granularity "step")
    pending: list[int] = []  # fragments of the NPU segment being collected

    def close(chained: bool = False) -> None:
        nonlocal seg, cands, spans, pending, n_segs
        if not seg:
            return
        for i in pending:
            seg_of[i] = len(out.segments)
        _emit_segment(cfg, out, seg, cands, spans, policy, timed, reuse, n_segs)
        n_segs += 1
        out.segments[-1].chained = chained
        seg, cands, spans, pending = [], [], [], []

    for idx in order:
        f = low.frags[idx]
        la = replace(f.layer)
        out.layers.append(la)
        if f.kind == "npu":
            items = tr.items(f.placed(k_npu % 2 == 1, cfg))
            k_npu += 1
            while items and items[-1].kind == "cand":  # the boundary point follows anyway
                items = items[:-1]
            live = fragment_liveness(items, cfg) if timed or policy else defaultdict(list)  # for points
            if granularity == "step":  # segments cut between steps; each but the last ends on a
                # boundary point whose live ranges are the on-chip data the next one continues on
                first_of[idx] = len(out.segments)
                start = 0
                carried: list[tuple[int, int]] = []  # on-chip data the previous cut left
                for cut in [*_step_cuts(items, cfg, step_cycles), len(items)]:
                    seg.extend(it for it in items[start:cut] if it.kind != "cand")
                    spans.append((la, 0, len(seg)))
                    last = cut == len(items)
                    cands.append(Candidate(len(seg), 0, True, [] if last else live[cut]))
                    if last:
                        pending.append(idx)
                    # a cut that leaves nothing on chip needs no chaining: the next step reloads
                    close(chained=bool(carried))
                    carried = [] if last else live[cut]
                    start = cut + 1
                _merge_layer(out, la, first_of[idx], cfg)
                continue
            base = len(seg)
            for i, it in enumerate(items):
                if it.kind == "cand":
                    cands.append(Candidate(base + i, 0, False, live[i]))
            seg.extend(items)
            spans.append((la, base, len(seg)))
            cands.append(Candidate(len(seg), 0, True, []))
            pending.append(idx)
            if granularity == "operator":
                close()
        elif f.kind == "host":
            close()
            seg_of[idx] = len(out.segments)
            out.segments.append(tr.host(f.host))
            out.host_models[f.host.model] = f.host_model
    close()
    if granularity in ("operator", "step"):
        _link_segments(low, out, seg_of, first_of)
    return out


def _busy_times(items: list[Item], cfg: NpuConfig) -> list[int]:
    """Estimated time at each item position and at the end (one entry more than `items`): the
    busiest unit's summed durations so far."""
    busy = [0, 0, 0, 0]
    t_at = []
    for it in items:
        t_at.append(max(busy))
        if it.kind == "instr":
            busy[int(it.instr.unit)] += duration(it.instr, cfg)
    t_at.append(max(busy))
    return t_at


def _step_cuts(items: list[Item], cfg: NpuConfig, step_cycles: int) -> list[int]:
    """Candidate positions to cut an operator at, packing its steps into segments of at most
    `step_cycles` estimated cycles (the busiest unit's summed durations) where the steps allow."""
    t_at = _busy_times(items, cfg)
    marks = [i for i, it in enumerate(items) if it.kind == "cand"]
    if not marks:
        return []
    ends = [t_at[i] for i in marks[1:]] + [t_at[-1]]  # when the step after each candidate ends
    last, cuts = 0, []
    for i, t_next in zip(marks, ends, strict=True):
        if t_next - last > step_cycles and t_at[i] > last:
            cuts.append(i)
            last = t_at[i]
    return cuts


def _merge_layer(out: Lowered, la: Layer, first: int, cfg: NpuConfig) -> None:
    """A layer cut into several segments (each holding only this layer): its pc range and cost
    figures cover all of them."""
    segs = out.segments[first:]
    if len(segs) > 1:
        la.pc = [segs[0].pc, la.pc[1]]
        la.compute_cycles, la.dma_cycles, _ = _estimate(out.program[segs[0].pc : la.pc[1]], cfg)
        la.est_cycles = sum(s.est_cycles or 0 for s in segs)


def _link_segments(low: Lowering, out: Lowered, seg_of: dict[int, int], first_of: dict[int, int]) -> None:
    """Each segment's `deps`: the segments producing what its operators read (through views); an
    operator cut into steps reads them in its first segment, and each later one follows the one
    before."""

    def producers(f: int) -> set[int]:
        if f in seg_of:
            return {seg_of[f]}
        return set().union(*(producers(d) for d in low.frags[f].deps))  # a view: look through it

    deps: list[set[int]] = [set() for _ in out.segments]
    for f, s in seg_of.items():
        first = first_of.get(f, s)
        for d in low.frags[f].deps:
            deps[first] |= producers(d)
        for k in range(first + 1, s + 1):
            deps[k].add(k - 1)
    for i, (s, d) in enumerate(zip(out.segments, deps, strict=True)):
        s.deps = sorted(d - {i})


def _unit_ends(m) -> dict[int, int]:
    """The latest end of each pc's unit work in a traced timing run (`timing_run(..., trace=True)`)."""
    end_of: dict[int, int] = {}
    for e in m.trace:
        if e.unit in UNIT_EVENTS:
            end_of[e.pc] = max(end_of.get(e.pc, 0), e.end)
    return end_of


def _simulated_times(
    cfg: NpuConfig, seg: list[Item], reuse: Reuse | None = None, k: int = 0
) -> tuple[list[int], int]:
    """Cycle at which each item position is reached, from the golden model's timing of the segment
    built without points (in the order its instructions can start, as `_with_points` builds it):
    the latest end of the items before it (what a point there waits for; the instructions after it
    in the built order do not move their ends much); and that build's cycles, as `_program_times`
    counts them. `reuse`: segment `k`'s build and times, where an assembly without timing left
    them."""
    kept = reuse.builds.get(k) if reuse is not None else None
    if kept is not None and kept[0] == len(seg):
        _, built, new_index = kept
        timed = reuse.times(k)
    else:
        built, new_index, _, _ = _with_points(cfg, seg, [], 0, timed=False)
        timed = None
    if timed is None:
        m = timing_run(cfg, built.instrs, trace=True)
        timed = (_unit_ends(m), m.counter_values()["CYCLES"])
    end_of, cycles = timed
    pcs = built.item_pcs
    t_at, latest = [], 0
    for i, it in enumerate(seg):
        t_at.append(latest)
        if it.kind == "instr":
            latest = max(latest, end_of.get(pcs[new_index[i]], latest))
    t_at.append(latest)
    return t_at, max(latest, cycles)


def _program_times(cfg: NpuConfig, instrs: list[Instr]) -> tuple[list[int], dict[int, int]]:
    """Cycle at which each pc of a built segment is reached (the latest end of the instructions
    before it), and its end, from the golden model's timing: the final program's, cancellation
    points included; and for each point (by pc) the cycle the first thing after it starts in any
    unit: a pause requested before then stops at that point (or an earlier one), from then on at
    the next, so the longest an urgent model waits is a point's reach less the previous point's
    first start (docs/isa.md, "Pause latency bound"). A point nothing starts after has none."""
    m = timing_run(cfg, instrs, trace=True)
    end_of = _unit_ends(m)
    first = first_starts_after(m.trace, [pc for pc, i in enumerate(instrs) if i.op == Opcode.CANCEL_POINT])
    reach, latest = [], 0
    for pc in range(len(instrs)):
        reach.append(latest)
        latest = max(latest, end_of.get(pc, latest))
    reach.append(max(latest, m.counter_values()["CYCLES"]))
    return reach, first


#: rounds of points added where the drains at the points stretch a gap past the interval
POINT_RETRIES = 4


def _with_points(
    cfg: NpuConfig, seg: list[Item], chosen: list[Candidate], first_id: int, timed: bool = True,
    reorder: bool = True, drained: frozenset[int] = frozenset(), orders: dict | None = None,
):  # fmt: skip
    """The segment built with cancellation points at `chosen` (ids from `first_id`): (the built
    program, item index -> builder position, [(point id, candidate)], _program_times of it). Not
    `reorder`: the instructions in the lowering's order (the same values; a build whose values alone
    matter skips the reordering's cost). `drained`: positions of points with SYNCs before them that
    let no unit pass the point before every unit has finished its work before it. `orders`: the
    start orders of the pieces between points by (first, end) item, kept across the builds of one
    segment (a retry that adds points reorders only the pieces they split).

    Between points (and barriers) the instructions go in the order they can start
    (`npu.program.start_order`), across operator boundaries that are not points: the next
    operator's loads run under this one's compute. Nothing crosses a point, so what is live there
    is what the points pass computed. An item maps to its instruction's new position (a candidate:
    the least position of the instructions after it in its piece, where they start)."""
    at = {c.pos: c for c in chosen}
    walls = {i + d for i, it in enumerate(seg) if it.kind not in ("instr", "cand") for d in (0, 1)}
    b = ProgramBuilder(cfg)
    new_index: dict[int, int] = {}
    point_ids: list[tuple[int, Candidate]] = []
    bounds = sorted({0, len(seg), *at, *(w for w in walls if w <= len(seg))})
    for lo, hi in zip(bounds, bounds[1:] + [None], strict=True):
        new_index[lo] = len(b)
        if lo in at:
            cp = first_id + len(point_ids)
            if lo in drained:
                b.drain()
            b.cancel_point(cp)
            point_ids.append((cp, at[lo]))
        if hi is None:
            break
        index = [i for i in range(lo, hi) if seg[i].kind != "cand"]
        base = len(b)
        if reorder and all(seg[i].kind == "instr" for i in index):
            order = orders.get((lo, hi)) if orders is not None else None
            if order is None:
                order = start_order([seg[i].instr for i in index], cfg)
                if orders is not None:
                    orders[(lo, hi)] = order
        else:  # a barrier (or not `reorder`): kept as it is
            order = list(range(len(index)))
        b.extend([seg[index[k]] for k in order])
        placed = {index[k]: base + n for n, k in enumerate(order)}
        nxt = len(b)
        for i in range(hi - 1, lo, -1):  # an instruction: its place; a candidate: the least place after it
            new_index[i] = placed.get(i, nxt)
            nxt = min(nxt, new_index[i])
    built = b.build()
    # the golden model's timing of the built segment (no data) is the cost model of its layers, its
    # points and itself: the busiest unit's summed durations missed the waits between units and at
    # the points by 10-30 % (docs/compiler.md)
    return built, new_index, point_ids, _program_times(cfg, built.instrs) if timed else ([], {})


def _emit_segment(
    cfg: NpuConfig,
    out: Lowered,
    seg: list[Item],
    cands: list[Candidate],
    spans,
    policy: PointPolicy | None,
    timed: bool = True,
    reuse: Reuse | None = None,
    k: int = 0,
) -> None:
    if policy is not None and policy.every_instruction:
        whole = [(0, cfg.spad_bytes), (ACC_BASE, ACC_BASE + cfg.acc_bytes)]
        cands = [Candidate(i, 0, False, whole) for i, it in enumerate(seg) if it.kind == "instr" and i > 0]
        cands.append(Candidate(len(seg), 0, True, []))
    # with an interval the points are placed on the golden model's timing, else on the estimate
    if policy is not None and policy.interval:
        t_at, without = _simulated_times(cfg, seg, reuse, k)
        if out.cycles_without_points is not None:
            out.cycles_without_points += without
    else:
        t_at = _busy_times(seg, cfg)
        if timed and policy is not None:  # points placed on estimates: the cost is not measured
            out.cycles_without_points = None
    for c in cands:
        c.t = t_at[c.pos]
    chosen = choose(cands, policy, cfg) if policy is not None else []
    seg_no = len(out.segments)
    # values only: the lowering's order, but for a timed assembly that takes this build as its first
    reorder = timed or reuse is not None
    orders: dict = {}  # each piece's start order, for the retries' builds
    built, new_index, point_ids, (reach, first) = _with_points(
        cfg, seg, chosen, len(out.points), timed, reorder, orders=orders
    )
    if not timed and reuse is not None and not chosen:
        reuse.builds[k] = (len(seg), built, new_index)
    if not timed:
        reach = _busy_times([Item("barrier" if i.unit is None else "instr", i) for i in built.instrs], cfg)
    # the points were chosen on the segment's timing without them, and the units pass a point
    # apart: where the wait of a pause (a point's reach less the previous point's first start)
    # exceeds the interval, the candidate nearest the middle becomes a point too, and the segment
    # is built and timed again
    limit = cfg.spad_bytes // 4 if policy is None or policy.max_live is None else policy.max_live
    drained: set[int] = set()
    for _ in range(POINT_RETRIES if policy is not None and policy.interval else 0):
        pcs = built.item_pcs + [len(built.instrs) - 1]
        when = {c.pos: reach[pcs[new_index[c.pos]]] for c in cands}
        # the points' own times (where the units have drained), as the report and the pause see
        # them, and when the first thing after each starts (a pause asked from then waits for the
        # next)
        pts = sorted(
            (reach[pc], first.get(pc, reach[pc]), c.pos)  # no trace (an untimed build): its reach
            for pc, c in ((built.cancel_points[cp], c) for cp, c in point_ids)
        )
        taken = {c.pos for c in chosen}
        extra, drain = [], set()
        for prev, (b, _, _) in zip([(0, 0, None), *pts], pts, strict=False):
            reach_a, a, pos_a = prev
            if b - a <= policy.interval:
                continue
            if reach_a - a > policy.interval // 2 and pos_a is not None:
                # a unit started work after the previous point half the interval or more before
                # that point's reach (its drain): points after it cannot close the gap, so no
                # unit passes that point before all have finished their work before it
                drain.add(pos_a)
                continue
            inside = [c for c in cands if c.pos not in taken and a < when[c.pos] < b]
            small = [c for c in inside if c.live_bytes <= limit]  # the live-data limit, as choose() keeps it
            inside = small if small or policy.max_live is not None else inside  # explicit: hard
            if inside:
                extra.append(min(inside, key=lambda c: abs(when[c.pos] - (a + b) / 2)))
        if not extra and drain <= drained:
            break
        drained |= drain
        chosen = sorted([*chosen, *extra], key=lambda c: c.pos)
        built, new_index, point_ids, (reach, first) = _with_points(
            cfg, seg, chosen, len(out.points), drained=frozenset(drained), orders=orders
        )
    start = len(out.program)
    out.program.extend(built.instrs)
    pcs = built.item_pcs + [len(built.instrs) - 1]
    # when the final program reaches each candidate position; a point's, when it is reached (drained)
    point_at = {c.pos: reach[built.cancel_points[cp]] for cp, c in point_ids}
    out.candidates += [
        {"segment": seg_no, "est_cycles": point_at.get(c.pos, reach[pcs[new_index[c.pos]]]),
         "live_bytes": c.live_bytes, "boundary": c.boundary}
        for c in cands
    ]  # fmt: skip
    for cp, c in point_ids:
        pc = start + built.cancel_points[cp]
        dump, restore = dma_cycles(c.live, cfg)
        out.points.append(
            CancelPoint(
                id=cp,
                pc=pc,
                kind="spill" if c.boundary else "interval",
                segment=seg_no,
                est_cycles=reach[built.cancel_points[cp]],
                est_first_start=first.get(built.cancel_points[cp]),
                live_ranges=[list(r) for r in c.live],
                live_bytes=c.live_bytes,
                dump_cycles=dump,
                restore_cycles=restore,
            )
        )
    durs = [duration(i, cfg) if i.unit is not None else 0 for i in built.instrs]
    _layer_figures(
        cfg, built.instrs, reach, start, spans, [pcs[new_index[i]] for i in range(len(seg))], seg, durs
    )
    figures = {**segment_figures(built.instrs, cfg, durs), "est_cycles": reach[-1]}
    out.segments.append(NpuSegment(start, len(out.program) - 1, **figures))


def _layer_figures(
    cfg: NpuConfig, instrs: list[Instr], reach: list[int], start: int, spans, pc_of, seg, durs: list[int]
) -> None:
    """Each layer's pc range (its first instruction to its last: layers overlap where the program
    order interleaves them), cost figures of its own instructions, and its share of the segment's
    cycles: each pc's advance of the time reached (`reach`) goes to the layer of that instruction, a
    point's to the layer after it, so the layers' cycles add up to the segment's up to its end
    point (what the device's CYCLES count)."""
    owner: list[int | None] = [None] * len(instrs)
    for k, (la, i0, i1) in enumerate(spans):
        mine = [pc_of[i] for i in range(i0, i1) if seg[i].kind == "instr"]
        for pc in mine:
            owner[pc] = k
        lo, hi = (min(mine), max(mine) + 1) if mine else (pc_of[i0] if i0 < len(pc_of) else len(instrs),) * 2
        la.pc = [start + lo, start + hi]
        mine = sorted(mine)
        la.compute_cycles, la.dma_cycles, _ = _estimate(
            [instrs[pc] for pc in mine], cfg, [durs[pc] for pc in mine]
        )
        la.est_cycles = 0
    nxt = None  # after the last instruction (the segment's end point): no layer's
    for pc in range(len(instrs) - 1, -1, -1):
        nxt = owner[pc] if owner[pc] is not None else nxt
        if nxt is not None:
            spans[nxt][0].est_cycles += reach[pc + 1] - reach[pc]
