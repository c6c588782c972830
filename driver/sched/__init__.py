"""Schedulers: they decide, the runtime executes through a transport (seed 001 operator queues)."""

from .opqueue import (
    POLICIES,
    Count,
    EngineQueue,
    ExpectedTime,
    Operator,
    OperatorQueues,
    RoundRobin,
    SharedQueue,
    make_dispatch,
    make_policy,
)

__all__ = [
    "POLICIES",
    "Count",
    "EngineQueue",
    "ExpectedTime",
    "Operator",
    "OperatorQueues",
    "RoundRobin",
    "SharedQueue",
    "make_dispatch",
    "make_policy",
]
