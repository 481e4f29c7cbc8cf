"""Admission policies as pure decisions: no shard, no threads."""

from __future__ import annotations

from psserver.core.admission import (
    NO_RESERVATION,
    PushRoute,
    Reservation,
    may_share_version_in_flight,
    pull_must_wait,
    push_route,
    reserve_refusal,
)
from psserver.core.consistency import Consistency, ConsistencyModel
from psserver.core.errors import ErrorKind

SSP_1 = Consistency(ConsistencyModel.SSP, staleness_bound=1)


def test_ssp_holds_a_pull_more_than_the_bound_ahead_of_the_slowest() -> None:
    assert not pull_must_wait(SSP_1, False, 3, [2, 3])
    assert pull_must_wait(SSP_1, False, 3, [1, 3])


def test_observers_and_other_models_are_never_held() -> None:
    assert not pull_must_wait(SSP_1, True, 9, [0])
    assert not pull_must_wait(Consistency(ConsistencyModel.ASYNC), False, 9, [0])
    assert not pull_must_wait(Consistency(ConsistencyModel.BSP), False, 9, [0])


def test_only_bsp_routes_a_push_to_the_round() -> None:
    assert push_route(ConsistencyModel.BSP) is PushRoute.BSP_ROUND
    assert push_route(ConsistencyModel.SSP) is PushRoute.APPLY
    assert push_route(ConsistencyModel.ASYNC) is PushRoute.APPLY


def test_only_asynchronous_training_shares_a_version_in_flight() -> None:
    assert may_share_version_in_flight(ConsistencyModel.ASYNC)
    assert not may_share_version_in_flight(ConsistencyModel.SSP)
    assert not may_share_version_in_flight(ConsistencyModel.BSP)


def test_reserving_needs_a_worker_of_a_rule_that_reserves() -> None:
    assert reserve_refusal(False, True, "gem") is None
    observer = reserve_refusal(True, True, "gem")
    assert observer is not None and observer.kind is ErrorKind.BAD_REQUEST and "observers" in observer.message
    other_rule = reserve_refusal(False, False, "asgd")
    assert other_rule is not None and "rule asgd" in other_rule.message


def test_a_reservation_admits_its_holder_only_until_it_lapses() -> None:
    held = NO_RESERVATION.taken_by(1, now=10.0, seconds=5.0)
    assert held == Reservation(1, 15.0)
    assert held.admits(1, 12.0) and not held.admits(2, 12.0)
    assert held.holder_at(15.0) == 1 and held.holder_at(15.1) is None
    assert held.admits(2, 15.1)


def test_pulling_again_does_not_extend_a_reservation_but_a_lapsed_one_is_taken_anew() -> None:
    held = NO_RESERVATION.taken_by(1, now=10.0, seconds=5.0)
    assert held.taken_by(1, now=14.0, seconds=5.0) is held
    assert held.taken_by(1, now=16.0, seconds=5.0) == Reservation(1, 21.0)
    assert held.taken_by(2, now=16.0, seconds=5.0) == Reservation(2, 21.0)


def test_only_the_holder_releases_a_reservation() -> None:
    held = Reservation(1, 15.0)
    assert held.released_by(2) is held
    assert held.released_by(1) is NO_RESERVATION
