"""Operator queues across engines (seed 001): one queue per engine and the policy that picks a queue.

Bookkeeping of the seed's rule (`ExpectedTime`): a queue's expected queuing time is its initial wait
plus the reference runtimes of the operators waiting in it; an operator goes to the queue with the
shortest expected time (ties to the lowest index); the time grows by the operator's reference runtime
when it is enqueued and shrinks by it when the operator leaves the queue to run. The baselines:
`Count` (fewest waiting operators, the prior art) and `RoundRobin`.

Operators are handed to `OperatorQueues.submit` once their inputs exist (every predecessor has
finished), so a queue's head can always start when its engine is free and dependencies across engines
are honoured without blocking a queue on another engine.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(eq=False)
class Operator:
    """One unit of work: `ref_cycles` is its reference runtime (profiled alone on a quiet engine)."""

    name: str
    ref_cycles: int
    job: object = None  # what the operator belongs to (the driver's job), opaque here
    payload: object = None  # what runs it (a program segment), opaque here

    def __post_init__(self) -> None:
        if self.ref_cycles < 0:
            raise ValueError(f"operator {self.name!r}: reference runtime {self.ref_cycles} is negative")


@dataclass
class EngineQueue:
    index: int
    initial_wait: int = 0
    waiting: deque[Operator] = field(default_factory=deque)
    expected: int = 0  # initial wait + reference runtimes of the waiting operators

    def __post_init__(self) -> None:
        self.expected = self.initial_wait + sum(op.ref_cycles for op in self.waiting)

    def enqueue(self, op: Operator) -> None:
        self.waiting.append(op)
        self.expected += op.ref_cycles

    def leave(self) -> Operator:
        """The head leaves the queue to run on the engine."""
        op = self.waiting.popleft()
        self.expected -= op.ref_cycles
        return op


class Policy(Protocol):
    name: str

    def choose(self, queues: list[EngineQueue], op: Operator) -> int: ...


class ExpectedTime:
    """The seed's rule: the queue with the shortest expected queuing time, ties to the lowest index."""

    name = "expected-time"

    def choose(self, queues: list[EngineQueue], op: Operator) -> int:
        return min(queues, key=lambda q: (q.expected, q.index)).index


class Count:
    """The prior art: the queue with the fewest waiting operators, ties to the lowest index."""

    name = "count"

    def choose(self, queues: list[EngineQueue], op: Operator) -> int:
        return min(queues, key=lambda q: (len(q.waiting), q.index)).index


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
    the engine its queue's head when it is free."""

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

    def submit(self, op: Operator) -> int:
        """Enqueue a ready operator where the policy says; the engine index."""
        i = self.policy.choose(self.queues, op)
        self.queues[i].enqueue(op)
        return i

    def next_for(self, engine: int) -> Operator | None:
        q = self.queues[engine]
        return q.leave() if q.waiting else None

    def expected(self) -> list[int]:
        return [q.expected for q in self.queues]

    def __len__(self) -> int:
        return sum(len(q.waiting) for q in self.queues)
