"""A BSP round's decisions: what a push does to it, when it is complete, what is recorded."""

from __future__ import annotations

import torch

from psserver.core.bsp_round import BspBarrier, Contribution
from psserver.core.rules import PayloadKind
from psserver.core.workers import PushOutcome, WorkerRecord

GRADIENT, DELTA = PayloadKind.GRADIENT, PayloadKind.DELTA


def worker(worker_id: int, name: str = "") -> WorkerRecord:
    return WorkerRecord(worker_id, name or f"w{worker_id}", "cpu", False)


def test_a_round_completes_once_every_live_worker_contributed_and_applies_the_mean() -> None:
    barrier, a, b = BspBarrier(), worker(1), worker(2)
    assert barrier.contribute(a, 7, GRADIENT, torch.ones(3), clock=0) == Contribution(0, retried=False)
    assert barrier.due([1, 2]) is None
    assert barrier.contribute(b, 9, GRADIENT, torch.full((3,), 3.0), clock=0) == Contribution(0, retried=False)
    due = barrier.due([1, 2])
    assert due is not None and torch.equal(due.mean(), torch.full((3,), 2.0))
    assert not barrier.finished(0)
    barrier.advance()
    assert barrier.finished(0) and barrier.due([1, 2]) is None


def test_a_second_push_of_one_worker_and_a_push_of_another_kind_are_refused() -> None:
    barrier, a, b = BspBarrier(), worker(1), worker(2)
    barrier.contribute(a, 1, GRADIENT, torch.ones(2), clock=4)
    again = barrier.contribute(a, 2, GRADIENT, torch.ones(2), clock=4)
    assert isinstance(again, str) and "already pushed for BSP clock 4" in again
    other_kind = barrier.contribute(b, 1, DELTA, torch.ones(2), clock=4)
    assert isinstance(other_kind, str) and "collects GRADIENT pushes only" in other_kind


def test_a_retried_push_from_a_rejoined_worker_takes_over_its_contribution() -> None:
    barrier, first = BspBarrier(), worker(1, "a")
    barrier.contribute(first, 5, GRADIENT, torch.ones(2), clock=0)
    rejoined = worker(3, "a")
    rejoined.memory = first.memory  # resumed: the same name's push-id memory
    assert barrier.contribute(rejoined, 5, GRADIENT, torch.ones(2), clock=0) == Contribution(0, retried=True)
    due = barrier.due([3])
    assert due is not None and due.contributors == {3: 5}
    assert torch.equal(due.total, torch.ones(2))  # not added twice


def test_recording_answers_gone_contributors_through_their_memory() -> None:
    barrier, a, b = BspBarrier(), worker(1), worker(2)
    barrier.contribute(a, 1, GRADIENT, torch.ones(2), clock=0)
    barrier.contribute(b, 4, GRADIENT, torch.ones(2), clock=0)
    due = barrier.due([1, 2])
    assert due is not None
    outcome = PushOutcome(1, 0, {})
    joined = due.record(outcome, {1: a})  # b left meanwhile
    assert joined == [a] and a.pushes == 1 and a.ssp_clock == 1
    assert b.memory.previous_outcome(4) is outcome and b.pushes == 0
