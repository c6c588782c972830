"""Operator-queue policies: the bookkeeping and the choices, exactly as the design states."""

import pytest

from npu.driver.sched import Operator, OperatorQueues, make_dispatch, make_policy


def ops(*cycles):
    return [Operator(f"op{i}", c) for i, c in enumerate(cycles)]


def test_expected_time_bookkeeping_grows_on_enqueue_and_shrinks_on_leave():
    """The seed: the time grows by an operator's runtime on enqueue and shrinks by it once the
    operator has been executed and leaves the queue (a running operator still counts)."""
    q = OperatorQueues(2, "expected-time", initial_wait=[5, 0])
    a, b, c = ops(100, 30, 20)
    assert q.submit(a) == 1  # 0 < 5
    assert q.expected() == [5, 100]
    assert q.submit(b) == 0 and q.expected() == [35, 100]
    assert q.submit(c) == 0 and q.expected() == [55, 100]
    assert q.next_for(0) is b and q.expected() == [55, 100]  # started, not yet executed
    q.finished(b, 0)
    assert q.expected() == [25, 100]
    assert q.next_for(1) is a and q.expected() == [25, 100]
    q.finished(a, 1)
    assert q.expected() == [25, 0]
    assert q.next_for(1) is None and len(q) == 1
    d = Operator("d", 7)
    assert q.submit(d) == 1  # 0 < 25: the idle engine's queue


def test_a_paused_operator_waits_again_and_still_counts():
    q = OperatorQueues(1, "expected-time")
    a, b = ops(50, 10)
    q.submit(a)
    assert q.next_for(0) is a
    q.submit(b)
    q.paused(a, 0)
    assert q.expected() == [60] and q.next_for(0) is a  # it keeps its place (arrived first)


def test_higher_priority_starts_first_within_a_queue_fifo_otherwise():
    q = OperatorQueues(1, "count")
    lo1, lo2 = Operator("lo1", 5), Operator("lo2", 5)
    hi = Operator("hi", 5, priority=2)
    for op in (lo1, lo2, hi):
        q.submit(op)
    assert [q.next_for(0) for _ in range(3)] == [hi, lo1, lo2]


def test_shared_queue_hands_any_engine_the_highest_priority_oldest():
    q = make_dispatch("shared", 2)
    a, b = Operator("a", 1), Operator("b", 1, priority=1)
    q.submit(a)
    q.submit(b)
    assert q.peek(1) is b and q.next_for(1) is b and q.next_for(0) is a and q.next_for(0) is None


def test_ties_go_to_the_lowest_index():
    for policy in ("expected-time", "count"):
        q = OperatorQueues(4, policy)
        assert q.submit(Operator("x", 10)) == 0
        assert q.submit(Operator("y", 10)) == 1


def test_count_puts_short_operators_behind_a_long_one_expected_time_does_not():
    """The seed's case: one long operator; count spreads by number and queues short ones behind
    it, expected-time sends them to the other engine."""
    placed = {}
    for policy in ("count", "expected-time"):
        q = OperatorQueues(2, policy)
        long, *short = ops(1000, 10, 10, 10)
        placed[policy] = [q.submit(op) for op in (long, *short)]
    assert placed["count"] == [0, 1, 0, 1]  # nothing has run yet: counts include every operator
    assert placed["expected-time"] == [0, 1, 1, 1]


def test_round_robin_cycles():
    q = OperatorQueues(3, "round-robin")
    assert [q.submit(op) for op in ops(1, 1000, 1, 1)] == [0, 1, 2, 0]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown operator-queue policy 'fastest'.*expected-time"):
        make_policy("fastest")
    with pytest.raises(ValueError, match="at least one engine"):
        OperatorQueues(0)
    with pytest.raises(ValueError, match="2 entries for 3 engines"):
        OperatorQueues(3, initial_wait=[0, 0])
    with pytest.raises(ValueError, match="negative"):
        Operator("bad", -1)
