"""Schedulers (operator queues, layer-wise scheduling): they decide, the runtime executes."""

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
