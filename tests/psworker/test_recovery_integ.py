"""The client's recovery decisions, taken on the refusal's reason (google.rpc.ErrorInfo), never its text.

Refusals are fake gRPC errors carrying a rich status built with ``psproto.errors.rich_status``,
so these tests hold whatever the server in this checkout attaches; the client around the
decisions runs against a real in-process server.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
import torch

from psproto.errors import Reason, rich_status
from psproto.layout import Layout
from psproto.reasons import TransientLimit
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psproto.wire import PulledChunk
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psworker.client import ClientConfig, PSClient, PushResult, RetryPolicy, Rollback
from psworker.sessions import (
    Recovery,
    ShardSession,
    is_future_clock,
    join_recovery_for,
    observe_clock,
    recovery_for,
)
from tests.psworker.live import serving

LAYOUT = Layout.from_named_shapes([("w", [4])], 1)
FAST = RetryPolicy(give_up_seconds=10.0, initial_backoff=0.001, max_backoff=0.001)


class FakeRpcError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """A failed call as grpc raises it: code, details and the trailers a rich status travels in."""

    def __init__(self, status: grpc.Status) -> None:
        self._status = status

    def code(self) -> grpc.StatusCode:
        return self._status.code

    def details(self) -> str:
        return str(self._status.details)

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return tuple(self._status.trailing_metadata)

    def initial_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False


class _BareStatus(grpc.Status):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        self.details = details
        self.trailing_metadata = ()


def refusal(
    code: grpc.StatusCode, reason: Reason, message: str = "refused", metadata: dict[str, str] | None = None
) -> FakeRpcError:
    return FakeRpcError(rich_status(code, reason, message, metadata))


def bare(code: grpc.StatusCode, message: str = "") -> FakeRpcError:
    """A failure without ErrorInfo: the transport's, or an older server's."""
    return FakeRpcError(_BareStatus(code, message))


# -- the decisions ----------------------------------------------------------------------------


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


def test_the_client_sends_a_push_again_while_every_receive_buffer_is_taken(served: tuple[Shard, str]) -> None:
    _, address = served
    with PSClient([address], LAYOUT, name="buffers", config=ClientConfig(retry=FAST)) as client:
        client.init(torch.zeros(4))
        attempts: list[int] = []

        def call(session: ShardSession) -> int:
            attempts.append(session.worker_id)
            if len(attempts) < 3:
                limit = {"limit": TransientLimit.RECEIVE_BUFFERS.value}
                raise refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.LIMIT_REACHED, "no buffer", limit)
            return len(attempts)

        assert client._call(0, call) == 3
        assert client.stats.retries == 2 and client.stats.rejoins == 0


def test_a_name_in_use_is_waited_out_on_the_first_join() -> None:
    held = refusal(grpc.StatusCode.ALREADY_EXISTS, Reason.NAME_IN_USE)
    assert join_recovery_for(held, FAST) is Recovery.WAIT_FOR_NAME
    assert recovery_for(held, FAST) is Recovery.FAIL  # on a joined session it is nothing to retry


def test_a_future_base_clock_is_recognised_by_its_reason() -> None:
    assert is_future_clock(refusal(grpc.StatusCode.OUT_OF_RANGE, Reason.FUTURE_CLOCK))
    assert not is_future_clock(refusal(grpc.StatusCode.OUT_OF_RANGE, Reason.CHUNK_OUT_OF_RANGE))


# -- the client acting on them ----------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[tuple[Shard, str]]:
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.1"})))
    with serving(shard) as address:
        yield shard, address


def test_the_client_joins_again_on_unknown_worker(served: tuple[Shard, str]) -> None:
    shard, address = served
    with PSClient([address], LAYOUT, name="rejoin", config=ClientConfig(retry=FAST)) as client:
        client.init(torch.zeros(4))
        first = client.sessions[0]
        seen: list[int] = []

        def call(session: ShardSession) -> int:
            seen.append(session.worker_id)
            if len(seen) == 1:
                raise refusal(grpc.StatusCode.NOT_FOUND, Reason.UNKNOWN_WORKER, "reworded: who are you?")
            return session.worker_id

        assert client._call(0, call) == client.sessions[0].worker_id
        assert client.stats.rejoins == 1
        assert client.sessions[0] is not first
        assert list(shard.workers) == [client.sessions[0].worker_id]


def test_the_client_raises_a_refusal_without_reason_whatever_its_text(served: tuple[Shard, str]) -> None:
    _, address = served
    with PSClient([address], LAYOUT, name="text", config=ClientConfig(retry=FAST)) as client:

        def call(session: ShardSession) -> None:
            raise bare(grpc.StatusCode.NOT_FOUND, f"worker {session.worker_id} is not joined (evicted)")

        with pytest.raises(grpc.RpcError):
            client._call(0, call)
        assert client.stats.rejoins == 0 and client.stats.retries == 0


def test_the_first_join_waits_out_a_name_in_use_without_resume(
    served: tuple[Shard, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, address = served
    real_join = PSClient._join
    attempts: list[bool] = []

    def join(self: PSClient, *args: object, resume: bool = False, **kwargs: object) -> ShardSession:
        attempts.append(resume)
        if len(attempts) == 1:
            raise refusal(grpc.StatusCode.ALREADY_EXISTS, Reason.NAME_IN_USE, "reworded")
        if len(attempts) == 2:
            raise bare(grpc.StatusCode.UNAVAILABLE)  # after a name was seen held, never resume
        return real_join(self, *args, resume=resume, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PSClient, "_join", join)
    with PSClient([address], LAYOUT, name="held", config=ClientConfig(retry=FAST)) as client:
        assert client.stats.retries == 2
    assert attempts == [False, False, False]


def test_a_successor_takes_over_a_dead_workers_name_at_once(served: tuple[Shard, str]) -> None:
    shard, address = served
    # The earlier process died without leaving: its record holds the name for a whole lease.
    dead = PSClient([address], LAYOUT, name="restarted", config=ClientConfig(retry=FAST))
    dead.init(torch.zeros(4))
    (earlier,) = shard.workers
    plain = ClientConfig(retry=RetryPolicy(give_up_seconds=0.0), connect_timeout=0.5)
    with pytest.raises(grpc.RpcError) as refused:
        PSClient([address], LAYOUT, name="restarted", config=plain)
    assert refused.value.code() is grpc.StatusCode.ALREADY_EXISTS
    successor = ClientConfig(retry=FAST, takes_over_name=True)
    with PSClient([address], LAYOUT, name="restarted", config=successor) as client:
        assert client.stats.retries == 0
        assert list(shard.workers) == [client.sessions[0].worker_id] != [earlier]
    dead.close()


def test_a_push_refused_for_a_future_base_clock_is_sent_against_the_shard_clock(served: tuple[Shard, str]) -> None:
    shard, address = served
    with PSClient([address], LAYOUT, name="future", config=ClientConfig(retry=FAST)) as client:
        client.init(torch.zeros(4))
        # As after a restart from an older checkpoint: this client saw clock 7, the shard is at 0.
        client.pulled_clocks[0] = client.seen_clocks[0] = 7
        real_send = client._send_push
        bases: list[int] = []

        def send(session: ShardSession, header: object, *args: object) -> PushResult:
            bases.append(header.base_clock)  # type: ignore[attr-defined]
            if len(bases) == 1:
                raise refusal(grpc.StatusCode.OUT_OF_RANGE, Reason.FUTURE_CLOCK, "reworded")
            return real_send(session, header, *args)  # type: ignore[arg-type]

        client._send_push = send  # type: ignore[method-assign]
        (result,) = client.push(torch.ones(4))
        assert bases == [7, 0]
        assert result.clock == shard.clock == 1
        assert client.rollbacks == [Rollback(0, 7, 0)]


class _OlderServersCall:
    """A PushPull call as a server without ``hetps-shard-clock`` answers it, sharing a version still
    in flight: parameters ``lag`` clocks older than the push's acknowledgement."""

    def __init__(self, call: Iterator[object], lag: int) -> None:
        self._call = call
        self._lag = lag

    def __iter__(self) -> Iterator[object]:
        for message in self._call:
            older = isinstance(message, PulledChunk)
            yield dataclasses.replace(message, clock=message.clock - self._lag) if older else message

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


def _params_clock_lowered_by(client: PSClient, lag: int) -> None:
    data = client.sessions[0].data
    real = data.push_pull
    data.push_pull = lambda *args, **kwargs: _OlderServersCall(real(*args, **kwargs), lag)  # type: ignore[assignment]


def test_from_an_older_server_a_push_pull_with_an_older_shared_version_is_no_rollback(
    served: tuple[Shard, str],
) -> None:
    shard, address = served
    with PSClient([address], LAYOUT, name="shared", config=ClientConfig(retry=FAST)) as client:
        client.init(torch.zeros(4))
        for _ in range(5):
            client.push(torch.ones(4))
        assert client.seen_clocks[0] == 5
        client.unary_push_pulls[0] = False  # an older server has no PushPullUnary either
        _params_clock_lowered_by(client, 2)
        out = torch.empty(4)
        (result,) = client.push(torch.ones(4), pull_into=out)
        assert result.clock == shard.clock == 6
        assert client.pulled_clocks[0] == 4  # the version's own clock, for the next push's staleness
        assert client.rollbacks == []


def test_a_push_pull_from_a_shard_behind_what_the_client_saw_is_a_rollback(served: tuple[Shard, str]) -> None:
    _, address = served
    with PSClient([address], LAYOUT, name="behind", config=ClientConfig(retry=FAST)) as client:
        client.init(torch.zeros(4))
        client.pull(torch.empty(4))
        # As after a restart from an older checkpoint: this client saw clock 9, the shard is at 0.
        client.seen_clocks[0] = 9
        _params_clock_lowered_by(client, 0)
        client.push(torch.ones(4), pull_into=torch.empty(4))
        assert client.rollbacks == [Rollback(0, 9, 1)]


def test_a_push_refused_for_another_reason_is_not_resent(served: tuple[Shard, str]) -> None:
    _, address = served
    with PSClient([address], LAYOUT, name="range", config=ClientConfig(retry=FAST)) as client:
        client.init(torch.zeros(4))
        sent: list[object] = []

        def send(*args: object) -> PushResult:
            sent.append(args)
            raise refusal(grpc.StatusCode.OUT_OF_RANGE, Reason.CHUNK_OUT_OF_RANGE, "ahead of the shard's clock")

        client._send_push = send  # type: ignore[method-assign]
        with pytest.raises(grpc.RpcError):
            client.push(torch.ones(4))
        assert len(sent) == 1


def test_a_call_without_answer_is_retried_on_a_new_connection_and_logged(
    served: tuple[Shard, str], caplog: pytest.LogCaptureFixture
) -> None:
    shard, address = served
    with PSClient([address], LAYOUT, name="silent", config=ClientConfig(retry=FAST)) as client:
        client.init(torch.zeros(4))
        first = client.sessions[0]
        used: list[ShardSession] = []

        def call(session: ShardSession) -> int:
            used.append(session)
            if len(used) == 1:
                raise bare(grpc.StatusCode.UNAVAILABLE, "Stream removed (ping timeout)")
            reply: ps_pb2.StatusResponse = session.stub.Status(ps_pb2.StatusRequest(), timeout=5)
            return reply.clock

        with caplog.at_level("WARNING", logger="psworker.client"):
            assert client._call(0, call) == 0
        second = client.sessions[0]
        assert used == [first, second]
        assert second.channel is not first.channel and second.stub is not first.stub
        # The same standing with the shard: no re-join needed for a new connection.
        assert (second.worker_id, second.join) == (first.worker_id, first.join)
        assert client.stats.reconnects == 1 and client.stats.rejoins == 0
        with pytest.raises(ValueError, match="closed channel"):
            first.stub.Status(ps_pb2.StatusRequest(), timeout=1)
        (line,) = [r.getMessage() for r in caplog.records if "new connection" in r.getMessage()]
        assert f"shard 0 at {address}" in line and "UNAVAILABLE: Stream removed (ping timeout)" in line
        assert list(shard.workers) == [first.worker_id]


def test_the_retry_budget_counts_from_the_first_failure_not_from_the_call(served: tuple[Shard, str]) -> None:
    _, address = served
    budget = RetryPolicy(give_up_seconds=0.3, initial_backoff=0.001, max_backoff=0.001)
    with PSClient([address], LAYOUT, name="budget", config=ClientConfig(retry=budget)) as client:
        attempts: list[float] = []

        def slow_then_fails_once(session: ShardSession) -> str:
            attempts.append(time.monotonic())
            if len(attempts) == 1:
                time.sleep(0.5)  # a long exchange that then breaks: longer than the whole budget
                raise bare(grpc.StatusCode.DEADLINE_EXCEEDED)
            return "answered"

        assert client._call(0, slow_then_fails_once) == "answered"

        def never_answers(session: ShardSession) -> None:
            raise bare(grpc.StatusCode.UNAVAILABLE)

        started = time.monotonic()
        with pytest.raises(grpc.RpcError):
            client._call(0, never_answers)
        assert 0.3 <= time.monotonic() - started < 2.0
        assert client.stats.reconnects >= 2


def test_a_first_join_without_answer_is_retried_on_a_new_channel(
    served: tuple[Shard, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, address = served
    real_join = PSClient._join
    channels: list[grpc.Channel] = []
    stubs: list[ps_pb2_grpc.ParameterServerStub] = []

    def join(
        self: PSClient, index: int, address: str, channel: grpc.Channel, *args: object, **kwargs: object
    ) -> ShardSession:
        channels.append(channel)
        stubs.append(ps_pb2_grpc.ParameterServerStub(channel))
        if len(channels) == 1:
            raise bare(grpc.StatusCode.DEADLINE_EXCEEDED)  # a handshake a silent link swallowed
        return real_join(self, index, address, channel, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PSClient, "_join", join)
    with PSClient([address], LAYOUT, name="handshake", config=ClientConfig(retry=FAST)) as client:
        assert len(channels) == 2 and channels[0] is not channels[1]
        assert client.sessions[0].channel is channels[1]
        with pytest.raises(ValueError, match="closed channel"):
            stubs[0].Status(ps_pb2.StatusRequest(), timeout=1)


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
