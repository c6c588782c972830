"""Operator queues across engines: one queue per engine and the policy that picks a queue.

Bookkeeping of the design's rule (`ExpectedTime`): a queue's expected queuing time is its initial wait
plus the reference runtimes of the operators waiting in it; an operator goes to the queue with the
shortest expected time (ties to the lowest index); the time grows by the operator's reference runtime
when it is enqueued and shrinks by it when the operator has been executed and leaves the queue (the
seed: "after a waiting operator is executed and leaves the queue"), so the operator an engine is
running still counts. The baselines: `Count` (fewest operators waiting or running, the prior art) and
`RoundRobin`.

Operators are handed to `OperatorQueues.submit` once their inputs exist (every predecessor has
finished), so a queue's head can always start when its engine is free and dependencies across engines
are honoured without blocking a queue on another engine. Within a queue, operators start in order of
priority, then of arrival (all equal priorities: the design's FIFO). `SharedQueue` is the policy with no
per-engine queues: one priority queue that every free engine takes from.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Protocol

_seq = itertools.count()


@dataclass(eq=False)
class Operator:
    """One unit of work: `ref_cycles` is its reference runtime (profiled alone on a quiet engine)."""

    name: str
    ref_cycles: int
    job: object = None  # what the operator belongs to (the driver's job), opaque here
    payload: object = None  # what runs it (a program segment), opaque here
    priority: int = 0  # higher starts first within a queue
    seq: int = field(default_factory=lambda: next(_seq))  # arrival order

    def __post_init__(self) -> None:
        if self.ref_cycles < 0:
            raise ValueError(f"operator {self.name!r}: reference runtime {self.ref_cycles} is negative")

    def key(self) -> tuple[int, int]:
        return (-self.priority, self.seq)


@dataclass
class EngineQueue:
    index: int
    initial_wait: int = 0
    waiting: list[Operator] = field(default_factory=list)  # kept as a heap of _Entry by Operator.key
    running: list[Operator] = field(default_factory=list)  # taken by the engine, not yet executed
    expected: int = 0  # initial wait + reference runtimes of the operators in the queue

    def __post_init__(self) -> None:
        # operators given here become heap entries like enqueued ones (Operator has no order)
        self.waiting = [_Entry(op) for op in self.waiting]
        heapq.heapify(self.waiting)
        self.expected = self.initial_wait + sum(e.op.ref_cycles for e in self.waiting)

    def __len__(self) -> int:
        """Operators in the queue: waiting, or running and not yet executed."""
        return len(self.waiting) + len(self.running)

    def enqueue(self, op: Operator) -> None:
        heapq.heappush(self.waiting, _Entry(op))
        self.expected += op.ref_cycles

    def peek(self) -> Operator | None:
        return self.waiting[0].op if self.waiting else None

    def take(self) -> Operator:
        """The head starts on the engine (it stays in the expected time until it has executed)."""
        op = heapq.heappop(self.waiting).op
        self.running.append(op)
        return op

    def leave(self, op: Operator) -> None:
        """`op` has executed and leaves the queue: the expected time shrinks by its runtime."""
        self.running.remove(op)
        self.expected -= op.ref_cycles

    def requeue(self, op: Operator) -> None:
        """`op` was paused before it finished: it waits again (its runtime still counted)."""
        self.running.remove(op)
        heapq.heappush(self.waiting, _Entry(op))


@dataclass(order=False)
class _Entry:
    op: Operator

    def __lt__(self, other: _Entry) -> bool:
        return self.op.key() < other.op.key()


class Policy(Protocol):
    name: str

    def choose(self, queues: list[EngineQueue], op: Operator) -> int: ...


class ExpectedTime:
    """The seed's rule: the queue with the shortest expected queuing time, ties to the lowest index."""

    name = "expected-time"

    def choose(self, queues: list[EngineQueue], op: Operator) -> int:
        return min(queues, key=lambda q: (q.expected, q.index)).index


class Count:
    """The prior art: the queue with the fewest operators, ties to the lowest index."""

    name = "count"

    def choose(self, queues: list[EngineQueue], op: Operator) -> int:
        return min(queues, key=lambda q: (len(q), q.index)).index


class RoundRobin:
    """Queues in turn, whatever they hold."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, queues: list[EngineQueue], op: Operator) -> int:
        i = self._next % len(queues)
        self._next = i + 1
        return queues[i].index


POLICIES: dict[str, type] = {p.name: p for p in (ExpectedTime, Count, RoundRobin)}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(
            f"unknown operator-queue policy {name!r}; choose one of {', '.join(POLICIES)}"
        ) from None


class OperatorQueues:
    """One queue per engine and a policy. `submit` places a ready operator; `next_for(engine)` hands
    the engine its queue's head when it is free; `finished(op, engine)` when it has executed."""

    def __init__(
        self, engines: int, policy: Policy | str = "expected-time", initial_wait: list[int] | None = None
    ):
        if engines < 1:
            raise ValueError(f"need at least one engine, got {engines}")
        waits = initial_wait or [0] * engines
        if len(waits) != engines:
            raise ValueError(f"initial_wait has {len(waits)} entries for {engines} engines")
        self.queues = [EngineQueue(i, w) for i, w in enumerate(waits)]
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self.name = self.policy.name

    def submit(self, op: Operator) -> int:
        """Enqueue a ready operator where the policy says; the engine index."""
        i = self.policy.choose(self.queues, op)
        self.queues[i].enqueue(op)
        return i

    def peek(self, engine: int) -> Operator | None:
        """What `engine` would start next."""
        return self.queues[engine].peek()

    def next_for(self, engine: int) -> Operator | None:
        q = self.queues[engine]
        return q.take() if q.waiting else None

    def finished(self, op: Operator, engine: int) -> None:
        self.queues[engine].leave(op)

    def paused(self, op: Operator, engine: int) -> None:
        """`op` stopped on `engine` before its end (preempted): it waits in that queue again."""
        self.queues[engine].requeue(op)

    def expected(self) -> list[int]:
        return [q.expected for q in self.queues]

    def __len__(self) -> int:
        return sum(len(q.waiting) for q in self.queues)


class SharedQueue:
    """No per-engine queues: one queue by priority, then arrival; any free engine takes its head."""

    name = "shared"

    def __init__(self, engines: int):
        self.engines = engines
        self.waiting: list[_Entry] = []

    def submit(self, op: Operator) -> int | None:
        heapq.heappush(self.waiting, _Entry(op))
        return None

    def peek(self, engine: int) -> Operator | None:
        return self.waiting[0].op if self.waiting else None

    def next_for(self, engine: int) -> Operator | None:
        return heapq.heappop(self.waiting).op if self.waiting else None

    def finished(self, op: Operator, engine: int) -> None:
        pass

    def paused(self, op: Operator, engine: int) -> None:
        heapq.heappush(self.waiting, _Entry(op))

    def __len__(self) -> int:
        return len(self.waiting)


def make_dispatch(policy: str, engines: int) -> OperatorQueues | SharedQueue:
    """The driver's dispatcher for a policy name: "shared" or one of the operator-queue policies."""
    if policy == "shared":
        return SharedQueue(engines)
    return OperatorQueues(engines, policy)
