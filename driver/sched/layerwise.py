"""Layer-wise scheduling of several models on one engine through the command ring.

Every request runs one layer (an NPU segment of a model compiled with `granularity="operator"`) at
a time; the host keeps `depth` layers in the ring, each followed by a FENCE, so that the loads of
the next layer (of another model) run under the compute of the current one. Each time a fence
completes, the scheduler picks the next layer among the candidates: the next layer of every
request that has none in flight (a model's layers share its on-chip region and read each other's
outputs, so they never overlap each other).

Policies:
* `fcfs`: whole models in arrival order (the baseline: no interleaving).
* `layer-rr`: layers of the requests in turn.
* `idle-time` (the design's rule): for every candidate, estimate the idle time it would cause on the
  compute resource (its DMA not hidden under the compute already queued) and on the DMA resource
  (DMA stalled because the on-chip memory is full until compute frees it); pick the least total,
  ties (within `tie_tolerance`) to the least DMA idle, then to arrival; a candidate passed over
  `starve_limit` times is forced.
* `order`: a given interleaving (for the exhaustive search over interleavings of small cases).

Priorities (as in preemption): candidates of the highest priority present go first, each policy choosing
among them. A request of higher priority than every layer in the ring does not wait behind it: the
scheduler pauses the engine at its next cancellation point, takes back the rest of the ring, appends
the urgent layer and then the rest again, and resumes. The models' on-chip regions are disjoint, so
nothing needs dumping: the paused layer's live data stays where it is.

Requests arrive at any time (their arrival order does not decide, except for `fcfs`). Several
models can be resident only if they were compiled into disjoint scratchpad regions; the scheduler
checks that requests that may overlap do not share on-chip memory when the manifest records the
regions.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from npu.container import Container, HostStep, NpuSegment
from npu.executor import HostSteps, check_inputs, read_outputs, write_inputs
from npu.isa import INSTR_BYTES, Opcode, decode_program, encode, make
from npu.program import token_syncs
from npu.registers import COUNTERS, Control, Status, unpack_tokens

from ..ring import Ring
from ..runtime import DriverError, Npu, Priority
from ..trace import chrome_document

POLICIES = ("fcfs", "layer-rr", "idle-time")
#: candidates whose estimated idle time is within this fraction of the least are tied (then: the
#: least DMA idle, then arrival): the estimator's layer figures are sums of instruction durations,
#: 13-57 % below the layers' own runtimes on the golden model, so a few percent decide nothing
TIE_TOLERANCE = 0.05
RING_SLOTS = 4096  # 128 KiB of ring: a few large layers


@dataclass
class RingLayer:
    """One NPU segment as the ring runs it (a layer of the layer-wise schedule), with the
    estimator's inputs."""

    index: int  # segment index in the manifest
    program: bytes  # its instructions (END dropped), relocated
    dma: int  # cycles of its LOAD/STORE instructions
    compute: int  # cycles of its matrix and vector instructions
    footprint: int  # on-chip bytes it uses


@dataclass(eq=False)
class Request:
    id: int
    name: str
    arrival: int
    inputs: list[np.ndarray]
    manifest: object
    host: HostSteps
    steps: list  # the manifest's segments (NPU and host) in order
    next_step: int = 0
    inflight: bool = False
    passed_over: int = 0
    env: dict = field(default_factory=dict)
    admitted: bool = False
    finish: int | None = None
    outputs: list[np.ndarray] | None = None
    key: int = 0  # its placed model: requests of one model share its DRAM and on-chip region
    priority: int = Priority.NORMAL

    @property
    def done(self) -> bool:
        return self.finish is not None

    def next_layer(self) -> RingLayer | None:
        s = self.steps[self.next_step] if self.next_step < len(self.steps) else None
        return s if isinstance(s, RingLayer) else None

    def upcoming(self, k: int) -> list[RingLayer]:
        """Its next `k` NPU layers in order (fewer before a host step or the end)."""
        out = []
        for s in self.steps[self.next_step : self.next_step + k]:
            if not isinstance(s, RingLayer):
                break
            out.append(s)
        return out


@dataclass
class Estimator:
    """The accelerator state the design's rule tracks: when DMA and compute are free (their gap), the
    on-chip memory in use, and what each in-flight layer holds."""

    capacity: int
    t_dma: int = 0
    t_compute: int = 0
    in_use: int = 0

    def idle(self, layer: RingLayer) -> tuple[int, int]:
        """(compute idle, DMA idle) that appending `layer` now would cause."""
        dma_idle = 0
        if self.in_use + layer.footprint > self.capacity:  # DMA waits for compute to free memory
            dma_idle = max(0, self.t_compute - self.t_dma)
        dma_start = self.t_dma + dma_idle
        compute_idle = max(0, dma_start + layer.dma - self.t_compute)
        return compute_idle, dma_idle

    def add(self, layer: RingLayer, now: int) -> None:
        self.t_dma, self.t_compute = max(self.t_dma, now), max(self.t_compute, now)
        _, d_idle = self.idle(layer)
        self.t_dma += d_idle + layer.dma
        self.t_compute = max(self.t_compute, self.t_dma) + layer.compute
        self.in_use += layer.footprint

    def remove(self, layer: RingLayer) -> None:
        self.in_use = max(0, self.in_use - layer.footprint)


class LayerwiseScheduler:
    """Runs requests on engine 0 of `npu` (its transport) through a command ring."""

    def __init__(self, npu: Npu, policy: str = "idle-time", *, depth: int = 2, window: int = 1,
                 starve_limit: int = 8, order: list[int] | None = None, preempt: bool = True,
                 tie_tolerance: float = TIE_TOLERANCE):  # fmt: skip
        if policy not in POLICIES and policy != "order":
            raise DriverError(f"unknown layer-wise policy {policy!r} (one of {', '.join(POLICIES)})")
        if npu.cfg.engines != 1:
            raise DriverError("the layer-wise scheduler drives a single engine")
        self.npu, self.tr, self.cfg = npu, npu.tr, npu.cfg.engine
        if window < 1:
            raise DriverError(f"window must be at least 1 layer, not {window}")
        self.policy, self.depth, self.starve_limit, self.window = policy, depth, starve_limit, window
        self.tie_tolerance = tie_tolerance
        self.preempt = preempt
        self.preemptions: list[dict] = []  # request, cycle asked, cycle paused, point id, ring count
        self._pause_asked: int | None = None  # cycle the pending pause was requested
        self._counts = dict.fromkeys(COUNTERS, 0)  # counters of the runs before a restart (START clears them)
        self.order = deque(order or [])
        self.requests: list[Request] = []
        self._ids = itertools.count()
        self._placed: dict[int, tuple] = {}
        base = npu.memory.alloc(RING_SLOTS * INSTR_BYTES)
        if base is None:
            raise DriverError("no DRAM left for the command ring")
        self.ring = Ring(self.tr, base, RING_SLOTS * INSTR_BYTES)
        self.est = Estimator(self.cfg.spad_bytes)
        self.timeline: list[tuple[int, str, int, int]] = []  # (request, model, layer, fence time)
        self.placed_layers: list[
            tuple[int, int, str, int, int]
        ] = []  # ring counts [lo, hi), model, request, layer

    # -- requests ---------------------------------------------------------------------------------
    def place(self, container: Container, name: str | None = None):
        """Load a model (once) for requests."""
        key = id(container)
        if key not in self._placed:
            man0 = container.manifest
            for other in self._placed.values():
                if man0.shares_onchip(other[1], self.cfg):
                    raise DriverError(
                        f"{name or 'the model'} and {other[0].name} share on-chip memory: compile them into "
                        "disjoint regions (npu compile --spad-region START:SIZE) to schedule them layer-wise"
                    )
            lm = self.npu.load(container, name)
            inst = lm.instances[0]
            man = inst.manifest
            steps: list = []
            for i, s in enumerate(man.segments):
                if isinstance(s, NpuSegment):
                    raw = self.tr.read_dram(
                        inst.program_base + s.pc * INSTR_BYTES, (s.end - s.pc) * INSTR_BYTES
                    )
                    if s.dma_cycles is None or s.compute_cycles is None or s.spad_bytes is None:
                        # an older container: the compiler's figures, from the instructions
                        from npu.compiler.assemble import segment_figures

                        s = replace(s, **segment_figures(decode_program(raw), self.cfg))
                    steps.append(RingLayer(i, raw, s.dma_cycles, s.compute_cycles, s.spad_bytes))
                else:
                    steps.append(s)
            self._placed[key] = (lm, man, lm.host, steps)
        return self._placed[key]

    def submit(
        self,
        container: Container,
        inputs: list[np.ndarray],
        at: int = 0,
        name: str | None = None,
        priority: int = Priority.NORMAL,
    ) -> Request:
        try:
            priority = Priority.of(priority, members_only=True)
        except ValueError as e:
            raise DriverError(str(e)) from None
        if isinstance(at, bool) or not isinstance(at, int | np.integer) or at < 0:
            raise DriverError(f"arrival time 'at' must be an integer >= 0, got {at!r}")
        lm, man, host, steps = self.place(container, name)
        xs = check_inputs(man, inputs)
        r = Request(next(self._ids), lm.name, at, xs, man, host, list(steps), key=id(container),
                    priority=int(priority))  # fmt: skip
        self.requests.append(r)
        return r

    # -- running ----------------------------------------------------------------------------------
    def _admit(self, now: int) -> None:
        """Arrived requests start, one per model at a time (its inputs and activations live in the
        model's DRAM and on-chip region), in arrival order."""
        for r in sorted(self.requests, key=lambda r: (r.arrival, r.id)):
            busy = any(o.admitted and not o.done and o.key == r.key for o in self.requests)
            if not r.admitted and r.arrival <= now and not busy:
                write_inputs(r.manifest, self.tr, r.inputs, r.env)
                r.admitted = True
                self._advance_host(r, now)

    def _advance_host(self, r: Request, now: int) -> None:
        """Run the host steps at the head of `r`; finish it when nothing is left."""
        while r.next_step < len(r.steps) and isinstance(r.steps[r.next_step], HostStep):
            r.host.run(self.tr, r.steps[r.next_step], r.env)
            r.next_step += 1
        if r.next_step >= len(r.steps) and r.finish is None:
            r.outputs = read_outputs(r.manifest, self.tr, r.env)
            r.finish = now

    def candidates(self) -> list[Request]:
        c = [r for r in self.requests if r.admitted and not r.done and not r.inflight and r.next_layer()]
        if c:  # the highest priority present goes first
            top = max(r.priority for r in c)
            c = [r for r in c if r.priority == top]
        return sorted(c, key=lambda r: (r.arrival, r.id))

    def choose(self, cands: list[Request]) -> Request | None:
        if not cands:
            return None
        if self.policy == "fcfs":
            first = min(
                (r for r in self.requests if not r.done and r.admitted and r.priority == cands[0].priority),
                key=lambda r: (r.arrival, r.id),
            )
            return first if first in cands else None
        if self.policy == "order":
            if not self.order:
                return cands[0]
            want = self.order[0]
            for r in cands:
                if r.id == want:
                    self.order.popleft()
                    return r
            return None  # the next in the order is not ready yet
        if self.policy == "layer-rr":
            last = self.timeline[-1][0] if self.timeline else -1
            after = [r for r in cands if r.id > last]
            return (after or cands)[0]
        forced = [r for r in cands if r.passed_over >= self.starve_limit]
        if forced:
            pick = max(forced, key=lambda r: r.passed_over)
        else:

            def score(r: Request):
                # the idle time of appending its next `window` layers one after another
                est, c, d = replace(self.est), 0, 0
                for layer in r.upcoming(self.window):
                    lc, ld = est.idle(layer)
                    c, d = c + lc, d + ld
                    est.add(layer, 0)
                return c + d, d

            scores = {r.id: score(r) for r in cands}
            least = min(s[0] for s in scores.values())
            # estimates within the tolerance of the least are ties (the cost model's own error)
            tied = [r for r in cands if scores[r.id][0] <= least * (1 + self.tie_tolerance)]
            pick = min(tied, key=lambda r: (scores[r.id][1], r.arrival, r.id))
        for r in cands:
            r.passed_over = 0 if r is pick else r.passed_over + 1
        return pick

    def run(self, timeout_cycles: int = 10**10) -> None:
        """Run every submitted request to completion."""
        tr, ring = self.tr, self.ring
        tr.set_reg("CONTROL", int(Control.SOFT_RESET))
        tr.set_reg("CONTROL", int(Control.IRQ_ENABLE))
        ring.start()
        self.t0 = tr.now()
        inflight: deque[tuple[Request, RingLayer]] = deque()
        done_fences = 0
        base = tr.reg("FENCE_COUNT")
        while not all(r.done for r in self.requests):
            now = tr.now()
            if now - self.t0 > timeout_cycles:
                raise DriverError(f"layer-wise run did not finish within {timeout_cycles} cycles")
            self._admit(now)
            if self.preempt and self._pause_asked is None and inflight:
                top = max(r.priority for r, _ in inflight)
                if any(r.priority > top for r in self.candidates()):
                    tr.set_reg("CONTROL", int(Control.PAUSE | Control.IRQ_ENABLE))
                    self._pause_asked = now
            while self._pause_asked is None and len(inflight) < self.depth:
                r = self.choose(self.candidates())
                if r is None:
                    break
                layer = r.next_layer()
                lo = ring.tail
                ring.append(layer.program + encode(make(Opcode.FENCE)))
                self.placed_layers.append((lo, ring.tail, r.name, r.id, layer.index))
                self.est.add(layer, now)
                r.inflight = True
                inflight.append((r, layer))
            st = Status(tr.reg("STATUS"))
            if self._pause_asked is not None and st in (Status.PAUSED, Status.WAITING):
                n = (tr.reg("FENCE_COUNT") - base) & 0xFFFFFFFF
                done_fences = self._retire(inflight, done_fences, n)
                if st == Status.PAUSED:
                    self._insert_urgent(inflight)
                else:  # the ring ran dry before a point: nothing to jump ahead of
                    tr.set_reg("CONTROL", int(Control.IRQ_ENABLE))
                self._pause_asked = None
                continue
            if st not in (Status.RUNNING, Status.WAITING):
                raise DriverError(f"the engine stopped running the ring: {st.name} "
                                  f"(error {tr.reg('ERROR_CODE')} at {tr.reg('ERROR_PC')})")  # fmt: skip
            pending = [r.arrival for r in self.requests if not r.admitted]
            tr.set_reg("IRQ", 1)
            n = (tr.reg("FENCE_COUNT") - base) & 0xFFFFFFFF
            if n == done_fences:
                nxt = min(pending) - tr.now() if pending else None
                if not inflight and nxt is None:
                    raise DriverError("nothing to run and nothing will arrive")
                tr.wait(None if nxt is None else max(1, nxt))
                n = (tr.reg("FENCE_COUNT") - base) & 0xFFFFFFFF
            done_fences = self._retire(inflight, done_fences, n)
        self.makespan = tr.now() - self.t0
        self.counters = {name: self._counts[name] + tr.counter(name) for name in COUNTERS}

    def _retire(self, inflight: deque, done_fences: int, n: int) -> int:
        """Account for the fences that completed (`n` since the start, `done_fences` seen)."""
        while done_fences < n:
            r, layer = inflight.popleft()
            done_fences += 1
            r.inflight = False
            r.next_step += 1
            self.est.remove(layer)
            t = self.tr.now()
            self.timeline.append((r.id, r.name, layer.index, t))
            self._advance_host(r, t)
        return done_fences

    def _insert_urgent(self, inflight: deque) -> None:
        """The engine is PAUSED at a cancellation point: the urgent candidate's next layer goes into
        the ring there, ahead of the rest of what was in it, and the engine resumes."""
        tr, ring = self.tr, self.ring
        for name in COUNTERS:  # START clears the counters: keep what this run counted
            self._counts[name] += tr.counter(name)
        r = self.choose(self.candidates())
        if r is None:  # nothing urgent is ready any more: resume as it was
            tr.set_reg("CONTROL", int(Control.START | Control.IRQ_ENABLE))
            return
        p = tr.reg("RESUME_PC")
        rest = ring.rewind(p)
        layer = r.next_layer()
        # the paused layer's tokens that cross the point: the urgent layer starts with empty
        # channels and SYNCs after its fence push them back (docs/isa.md, "The command ring")
        crossing = token_syncs(unpack_tokens(tr.resume_tokens()))
        tr.set_resume_tokens([0, 0, 0])
        urgent = layer.program + encode(make(Opcode.FENCE))
        syncs = b"".join(encode(ins) for ins in crossing)
        k = (len(urgent) + len(syncs)) // INSTR_BYTES  # what follows p moves by k
        moved = []
        for lo, hi, name, rid, li in self.placed_layers:  # trace bookkeeping: what follows p moves by k
            if hi <= p:
                moved.append((lo, hi, name, rid, li))
            elif lo >= p:
                moved.append((lo + k, hi + k, name, rid, li))
            else:  # the paused layer: its part after the point runs after the urgent one
                moved += [(lo, p, name, rid, li), (p + k, hi + k, name, rid, li)]
        moved.append((p, p + len(urgent) // INSTR_BYTES, r.name, r.id, layer.index))
        self.placed_layers = sorted(moved)
        ring.append(urgent + syncs + rest)
        now = tr.now()
        self.est.add(layer, now)
        r.inflight = True
        inflight.appendleft((r, layer))
        asked = self._pause_asked
        self.preemptions.append({"request": r.id, "asked": asked, "paused": now, "latency": now - asked,
                                 "point": tr.reg("CP_ID"), "count": p})  # fmt: skip
        tr.set_reg("CONTROL", int(Control.START | Control.IRQ_ENABLE))


def chrome_trace(sched: LayerwiseScheduler, events, clock_mhz: float) -> dict:
    """A Perfetto (Chrome) trace of a layer-wise run: one track per unit, each instruction named by
    the model and layer it belongs to (`events`: the golden model's instruction trace, whose pcs
    are ring counts), so the interleaving of the models shows unit by unit."""
    import bisect

    los = [p[0] for p in sched.placed_layers]
    us = 1.0 / clock_mhz
    out = []
    for e in events:
        if e.unit not in ("load", "matrix", "vector", "store") or e.end <= e.start:
            continue
        i = bisect.bisect_right(los, e.pc) - 1
        if i < 0 or e.pc >= sched.placed_layers[i][1]:
            continue
        _, _, model, req, layer = sched.placed_layers[i]
        out.append({"name": f"{model} #{req} layer {layer}", "cat": model, "ph": "X", "pid": 1, "tid": e.unit,
                    "ts": (e.start - sched.t0) * us, "dur": (e.end - e.start) * us,
                    "args": {"op": e.op, "count": e.pc}})  # fmt: skip
    return chrome_document(out)
