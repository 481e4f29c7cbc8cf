"""Admission policies as pure decisions: no shard, no threads."""

from __future__ import annotations

from psserver.core.admission import (
    PushRoute,
    exclusive_pull_refusal,
    may_share_version_in_flight,
    pull_must_wait,
    push_route,
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


def test_an_exclusive_pull_needs_a_worker_of_a_rule_that_takes_one() -> None:
    assert exclusive_pull_refusal(False, None) is None
    observer = exclusive_pull_refusal(True, None)
    assert observer is not None and observer.kind is ErrorKind.BAD_REQUEST and "observers" in observer.message
    other_rule = exclusive_pull_refusal(False, "rule asgd with these options takes no exclusive pulls")
    assert other_rule is not None and other_rule.kind is ErrorKind.BAD_REQUEST and "rule asgd" in other_rule.message
