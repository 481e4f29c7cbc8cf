"""Membership: names, resume, limits, leases and the saved form, without a shard."""

from __future__ import annotations

import pytest

from psserver.core.errors import ErrorKind, ShardError
from psserver.core.membership import IDLE_MEMORIES_KEPT, Membership
from psserver.core.observer import NullObserver
from psserver.core.refusals import Refusals
from psserver.core.workers import PushOutcome


def members(max_workers: int = 8) -> tuple[Membership, Refusals]:
    refusals = Refusals(NullObserver())
    return Membership(refusals, lease_seconds=10.0, max_workers=max_workers), refusals


def join(membership: Membership, name: str, now: float = 0.0, resume: bool = False, observer: bool = False) -> int:
    assert membership.admission(name, resume, now) == []
    return membership.enrol(name, "cpu", observer, resume, now).worker_id


def test_a_name_in_use_is_refused_without_resume() -> None:
    membership, refusals = members()
    join(membership, "a")
    with pytest.raises(ShardError, match="in use by joined worker 1") as refused:
        membership.admission("a", False, 3.0)
    assert refused.value.kind is ErrorKind.NAME_IN_USE and refusals.counts() == {"name_in_use": 1}


def test_resuming_replaces_the_old_record_and_keeps_the_names_push_ids() -> None:
    membership, _ = members()
    first = join(membership, "a")
    membership.workers[first].record_push(5, PushOutcome(1, 0, {}))
    replaced = membership.admission("a", True, 1.0)
    assert replaced == [first]
    membership.remove(first)
    again = membership.enrol("a", "cpu", False, True, 1.0)
    assert again.worker_id != first and again.previous_outcome(5) is not None


def test_the_worker_limit_counts_a_replaced_record_as_gone() -> None:
    membership, _ = members(max_workers=1)
    join(membership, "a")
    assert membership.admission("a", True, 0.0) == [1]
    with pytest.raises(ShardError) as refused:
        membership.admission("b", False, 0.0)
    assert refused.value.kind is ErrorKind.LIMIT_REACHED


def test_a_newcomer_starts_level_with_the_slowest_live_worker() -> None:
    membership, _ = members()
    slow, fast = join(membership, "slow"), join(membership, "fast")
    membership.workers[slow].ssp_clock, membership.workers[fast].ssp_clock = 3, 7
    join(membership, "watcher", observer=True)
    assert membership.enrol("new", "cpu", False, False, 0.0).ssp_clock == 3
    assert [w.name for w in membership.live()] == ["slow", "fast", "new"]


def test_unknown_workers_are_refused() -> None:
    membership, _ = members()
    with pytest.raises(ShardError, match="call Join again") as refused:
        membership.get(42)
    assert refused.value.kind is ErrorKind.UNKNOWN_WORKER


def test_silent_workers_expire_unless_they_wait_inside_the_shard() -> None:
    membership, _ = members()
    silent, waiting = join(membership, "silent"), join(membership, "waiting")
    join(membership, "recent", now=5.0)
    membership.workers[waiting].waiting = True
    expired = membership.expire(now=12.0)
    assert [w.worker_id for w in expired] == [silent] and membership.evictions == 1
    assert silent in membership  # the shard removes it (and releases what it held)


def test_idle_memories_are_forgotten_beyond_the_limit() -> None:
    membership, _ = members(max_workers=IDLE_MEMORIES_KEPT + 10)
    for index in range(IDLE_MEMORIES_KEPT + 2):
        worker_id = join(membership, f"w{index}")
        membership.remove(worker_id)
    memories = membership.state_dict()["memories"]
    assert len(memories) == IDLE_MEMORIES_KEPT
    assert f"w{IDLE_MEMORIES_KEPT + 1}" in memories and "w0" not in memories


def test_the_saved_form_round_trips() -> None:
    membership, _ = members()
    first = join(membership, "a")
    membership.workers[first].record_push(2, PushOutcome(4, 1, {"x": 1.0}))
    for expired in membership.expire(now=100.0):
        membership.remove(expired.worker_id)
    saved = membership.state_dict()
    restored, _ = members()
    restored.load_state_dict(saved, now=50.0)
    assert restored.evictions == 1 and restored.workers == {}
    again = restored.enrol("a", "cpu", False, True, 50.0)
    assert again.worker_id > first and again.previous_outcome(2) == PushOutcome(4, 1, {"x": 1.0})
