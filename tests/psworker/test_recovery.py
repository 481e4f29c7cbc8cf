"""The client's recovery decisions, taken on the refusal's reason (google.rpc.ErrorInfo), never its
text, and where a shard's replica set sends a call next: pure functions of the error, tested
without a server (tests/psworker/test_recovery_integ.py has the client acting on them)."""

from __future__ import annotations

import grpc

from psproto.errors import Reason
from psproto.reasons import EPOCH_KEY, PRIMARY_KEY, TransientLimit
from psworker.client import RetryPolicy, Rollback
from psworker.sessions import (
    FOLLOW_PAUSE_S,
    Recovery,
    is_future_clock,
    join_recovery_for,
    next_address,
    next_replica,
    observe_clock,
    quick_pause,
    reconnect_note,
    recovery_for,
)
from tests.psworker.refusals import FakeRpcError, bare, refusal

FAST = RetryPolicy(give_up_seconds=10.0, initial_backoff=0.001, max_backoff=0.001)


def test_an_unknown_worker_is_joined_again() -> None:
    assert recovery_for(refusal(grpc.StatusCode.NOT_FOUND, Reason.UNKNOWN_WORKER), FAST) is Recovery.REJOIN


def test_the_message_text_alone_decides_nothing() -> None:
    # The words the client once searched for, without a reason: not a re-join.
    assert recovery_for(bare(grpc.StatusCode.NOT_FOUND, "worker 3 is not joined (evicted)"), FAST) is Recovery.FAIL
    future = bare(grpc.StatusCode.OUT_OF_RANGE, "base clock 9 is ahead of the shard's clock 2")
    assert not is_future_clock(future)
    assert join_recovery_for(bare(grpc.StatusCode.ALREADY_EXISTS, "name in use"), FAST) is Recovery.FAIL


def test_a_call_without_answer_is_sent_again_on_a_new_connection() -> None:
    # No reason: the transport's own failure (a keepalive that went unanswered, a deadline that
    # ran out, a server down): the connection is suspect, so it is replaced.
    for code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        assert recovery_for(bare(code, "Stream removed (ping timeout)"), FAST) is Recovery.RECONNECT
        assert join_recovery_for(bare(code), FAST) is Recovery.RECONNECT
    # Cancelled under the call (another call replaced its connection): the same call again.
    assert recovery_for(bare(grpc.StatusCode.CANCELLED), FAST) is Recovery.RETRY
    assert join_recovery_for(bare(grpc.StatusCode.CANCELLED), FAST) is Recovery.RETRY
    assert recovery_for(bare(grpc.StatusCode.INVALID_ARGUMENT), FAST) is Recovery.FAIL


def test_a_draining_server_is_retried_not_given_up() -> None:
    draining = refusal(grpc.StatusCode.UNAVAILABLE, Reason.DRAINING)
    assert recovery_for(draining, FAST) is Recovery.RETRY
    assert join_recovery_for(draining, FAST) is Recovery.RETRY


def test_a_policy_without_reconnect_codes_only_retries_or_fails() -> None:
    policy = RetryPolicy(reconnect_codes=frozenset(), retry_codes=frozenset({grpc.StatusCode.UNAVAILABLE}))
    assert recovery_for(bare(grpc.StatusCode.UNAVAILABLE), policy) is Recovery.RETRY
    assert recovery_for(bare(grpc.StatusCode.DEADLINE_EXCEEDED), policy) is Recovery.FAIL


def test_a_stalled_push_is_retried_and_other_refusals_fail() -> None:
    assert recovery_for(refusal(grpc.StatusCode.CANCELLED, Reason.PUSH_STALLED), FAST) is Recovery.RETRY
    for code, reason in [
        (grpc.StatusCode.FAILED_PRECONDITION, Reason.LAYOUT_MISMATCH),
        (grpc.StatusCode.OUT_OF_RANGE, Reason.CHUNK_OUT_OF_RANGE),
        (grpc.StatusCode.INVALID_ARGUMENT, Reason.NON_FINITE),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.LIMIT_REACHED),
        # A reason the client does not retry, even on a code it retries when no reason is given.
        (grpc.StatusCode.UNAVAILABLE, Reason.CHECKPOINT_FAILED),
    ]:
        assert recovery_for(refusal(code, reason), FAST) is Recovery.FAIL, reason


def test_a_limit_that_passes_on_its_own_is_retried_and_the_others_fail() -> None:
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    for limit in TransientLimit:
        transient = refusal(exhausted, Reason.LIMIT_REACHED, "reworded", {"limit": limit.value})
        assert recovery_for(transient, FAST) is Recovery.RETRY, limit
    for metadata in (None, {"limit": "max_workers"}, {"other": "receive_buffers"}):
        assert recovery_for(refusal(exhausted, Reason.LIMIT_REACHED, "full", metadata), FAST) is Recovery.FAIL
    # Only a LIMIT_REACHED: the same metadata on another reason decides nothing.
    other = refusal(exhausted, Reason.BAD_REQUEST, "bad", {"limit": TransientLimit.RECEIVE_BUFFERS.value})
    assert recovery_for(other, FAST) is Recovery.FAIL


def test_a_name_in_use_is_waited_out_on_the_first_join() -> None:
    held = refusal(grpc.StatusCode.ALREADY_EXISTS, Reason.NAME_IN_USE)
    assert join_recovery_for(held, FAST) is Recovery.WAIT_FOR_NAME
    assert recovery_for(held, FAST) is Recovery.FAIL  # on a joined session it is nothing to retry


def test_a_future_base_clock_is_recognised_by_its_reason() -> None:
    assert is_future_clock(refusal(grpc.StatusCode.OUT_OF_RANGE, Reason.FUTURE_CLOCK))
    assert not is_future_clock(refusal(grpc.StatusCode.OUT_OF_RANGE, Reason.CHUNK_OUT_OF_RANGE))


def test_a_clock_below_the_highest_seen_is_a_rollback_and_the_count_starts_again_from_it() -> None:
    seen = [5, 0]
    assert observe_clock(seen, 0, 7) is None and seen == [7, 0]
    rollback = observe_clock(seen, 0, 3)
    assert rollback == Rollback(0, 7, 3) and seen == [3, 0]
    assert str(rollback) == "shard 0 is back at clock 3 after 7: 4 update(s) were lost"
    assert observe_clock(seen, 0, 3) is None


def test_a_reply_that_crossed_a_newer_clock_is_no_rollback_and_keeps_the_newer_one() -> None:
    seen = [5]
    # A heartbeat sent when 5 was the highest seen is answered with 6, but read after a push's
    # acknowledgement raised the highest seen to 8: the shard went forward, not back.
    assert observe_clock(seen, 0, 8) is None
    assert observe_clock(seen, 0, 6, seen_when_sent=5) is None and seen == [8]
    # Below what was seen when it was sent: the shard went back.
    assert observe_clock(seen, 0, 4, seen_when_sent=8) == Rollback(0, 8, 4) and seen == [4]


# -- replica sets ------------------------------------------------------------------------------

SET = ("10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051")


def not_primary(primary: str | None, message: str = "a backup") -> FakeRpcError:
    metadata = {} if primary is None else {PRIMARY_KEY: primary, EPOCH_KEY: "7" if primary else ""}
    return refusal(grpc.StatusCode.UNAVAILABLE, Reason.NOT_PRIMARY, message, metadata)


def test_a_replica_that_is_not_the_primary_is_followed_on_any_call_and_the_first_join() -> None:
    refused = not_primary(SET[2])
    assert recovery_for(refused, FAST) is Recovery.FOLLOW
    assert join_recovery_for(refused, FAST) is Recovery.FOLLOW
    # Even a policy that retries nothing follows: the refusal says where the call belongs.
    assert recovery_for(refused, RetryPolicy(reconnect_codes=frozenset(), retry_codes=frozenset())) is Recovery.FOLLOW


def test_a_call_follows_the_primary_the_refusal_names() -> None:
    assert next_address(Recovery.FOLLOW, not_primary(SET[2]), SET, SET[0]) == SET[2]
    # A primary known by an address the worker was not given is followed all the same.
    assert next_address(Recovery.FOLLOW, not_primary("psserver-1.psserver:50051"), SET, SET[0]) == (
        "psserver-1.psserver:50051"
    )


def test_without_a_named_primary_the_call_goes_to_the_next_replica() -> None:
    # An election is running (empty), the metadata is missing, or the replica names itself.
    for refused in (not_primary(""), not_primary(None), not_primary(SET[1])):
        assert next_address(Recovery.FOLLOW, refused, SET, SET[1]) == SET[2]
    assert next_address(Recovery.FOLLOW, not_primary(""), SET, SET[2]) == SET[0]  # round the end


def test_no_answer_from_a_replica_of_a_set_goes_to_the_next_and_a_single_server_stays() -> None:
    silent = bare(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    assert next_address(Recovery.RECONNECT, silent, SET, SET[0]) == SET[1]
    assert next_address(Recovery.RECONNECT, silent, SET[:1], SET[0]) == SET[0]
    # A retry on the same connection stays where it is, even in a set.
    assert next_address(Recovery.RETRY, refusal(grpc.StatusCode.UNAVAILABLE, Reason.DRAINING), SET, SET[1]) == SET[1]


def test_the_next_replica_wraps_round_and_starts_from_the_first_for_an_address_outside_the_set() -> None:
    assert [next_replica(SET, a) for a in SET] == [SET[1], SET[2], SET[0]]
    assert next_replica(SET, "elsewhere:1") == SET[0]
    assert next_replica(SET[:1], SET[0]) == SET[0]


def test_a_move_to_another_replica_waits_a_short_fixed_pause_until_the_whole_set_gave_no_answer() -> None:
    assert quick_pause(Recovery.FOLLOW, 0, 1) == FOLLOW_PAUSE_S == 0.1
    assert quick_pause(Recovery.RECONNECT, 1, 3) == quick_pause(Recovery.RECONNECT, 2, 3) == FOLLOW_PAUSE_S
    # Every replica tried without an answer, or a single server down: the growing backoff.
    assert quick_pause(Recovery.RECONNECT, 3, 3) is None
    assert quick_pause(Recovery.RECONNECT, 1, 1) is None
    assert quick_pause(Recovery.RETRY, 0, 3) is None


def test_a_switch_is_logged_naming_the_shard_both_addresses_and_why() -> None:
    followed = reconnect_note(2, SET[0], SET[1], not_primary(SET[1], "a backup of epoch 7"), 0.01, 0.01, 300)
    assert followed.startswith(f"shard 2 at {SET[0]}: not the primary (a backup of epoch 7)")
    assert f"switched to {SET[1]}" in followed
    silent = bare(grpc.StatusCode.UNAVAILABLE, "connection refused")
    moved = reconnect_note(0, SET[1], SET[2], silent, 0.0, 1.5, 300)
    assert "no answer (UNAVAILABLE: connection refused)" in moved and f"switched to {SET[2]}" in moved
    assert "failing for 1.5 s" in moved
    assert "opened a new connection" in reconnect_note(0, SET[0], SET[0], silent, 0.0, 0.0, 300)
