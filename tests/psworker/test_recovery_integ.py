"""The client acting on its recovery decisions (tests/psworker/test_recovery.py) against a real
in-process server, the refusals made without one (tests/psworker/refusals.py)."""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Iterator

import grpc
import pytest
import torch

from psproto.errors import Reason
from psproto.layout import Layout
from psproto.reasons import PRIMARY_KEY, TransientLimit
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psproto.wire import PulledChunk
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psworker.client import ClientConfig, PSClient, PushResult, RetryPolicy, Rollback
from psworker.sessions import FOLLOW_PAUSE_S, ShardSession
from tests.psworker.live import serving
from tests.psworker.refusals import bare, refusal

LAYOUT = Layout.from_named_shapes([("w", [4])], 1)
FAST = RetryPolicy(give_up_seconds=10.0, initial_backoff=0.001, max_backoff=0.001)


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


def _closed_port() -> str:
    """A loopback address nothing listens on: connecting is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def test_a_call_refused_by_a_replica_follows_to_the_primary_it_names(
    served: tuple[Shard, str], caplog: pytest.LogCaptureFixture
) -> None:
    shard, address = served
    backup = _closed_port()
    with PSClient([f"{address}|{backup}"], LAYOUT, name="follower", config=ClientConfig(retry=FAST)) as client:
        client.init(torch.zeros(4))
        first = client.sessions[0]
        used: list[str] = []

        def call(session: ShardSession) -> int:
            used.append(session.address)
            if len(used) == 1:  # an election: no primary named, so the next replica
                raise refusal(grpc.StatusCode.UNAVAILABLE, Reason.NOT_PRIMARY, "deposed", {PRIMARY_KEY: ""})
            if len(used) == 2:  # that one names the primary
                raise refusal(grpc.StatusCode.UNAVAILABLE, Reason.NOT_PRIMARY, "a backup", {PRIMARY_KEY: address})
            reply: ps_pb2.StatusResponse = session.stub.Status(ps_pb2.StatusRequest(), timeout=5)
            return reply.clock

        started = time.monotonic()
        with caplog.at_level("WARNING", logger="psworker.client"):
            assert client._call(0, call) == 0
        # Two fixed pauses of 0.1 s, not a growing backoff.
        assert 2 * FOLLOW_PAUSE_S <= time.monotonic() - started < 1.0
        assert used == [address, backup, address]
        assert (client.stats.follows, client.stats.reconnects, client.stats.rejoins) == (2, 0, 0)
        # The same standing (worker id, Join reply) on every replica: the same call is sent again.
        assert (client.sessions[0].worker_id, client.sessions[0].join) == (first.worker_id, first.join)
        lines = [r.getMessage() for r in caplog.records if "switched to" in r.getMessage()]
        assert len(lines) == 2
        assert f"shard 0 at {address}: not the primary (deposed)" in lines[0] and f"switched to {backup}" in lines[0]
        assert f"shard 0 at {backup}: not the primary (a backup)" in lines[1] and f"switched to {address}" in lines[1]
        client.push(torch.ones(4))
        assert shard.clock == 1


def test_the_first_join_goes_past_a_replica_that_is_down(served: tuple[Shard, str]) -> None:
    _, address = served
    down = _closed_port()
    started = time.monotonic()
    with PSClient([f"{down}|{address}"], LAYOUT, name="past", config=ClientConfig(retry=FAST)) as client:
        # Not waited for (a single server is, for connect_timeout): the next replica is asked at once.
        assert time.monotonic() - started < 5.0
        assert client.sessions[0].address == address
        assert client.stats.follows == 1 and client.stats.reconnects == 0
        client.init(torch.zeros(4))
        (result,) = client.push(torch.ones(4))
        assert result.clock == 1


def test_a_whole_set_without_answer_is_backed_off_from_as_a_single_server(served: tuple[Shard, str]) -> None:
    _, address = served
    backup = _closed_port()
    budget = RetryPolicy(give_up_seconds=1.0, initial_backoff=0.4, max_backoff=0.4)
    with PSClient([f"{address}|{backup}"], LAYOUT, name="all-down", config=ClientConfig(retry=budget)) as client:
        attempts: list[tuple[str, float]] = []

        def never_answers(session: ShardSession) -> None:
            attempts.append((session.address, time.monotonic()))
            raise bare(grpc.StatusCode.UNAVAILABLE)

        with pytest.raises(grpc.RpcError):
            client._call(0, never_answers)
        addresses = [a for a, _ in attempts]
        assert addresses[:3] == [address, backup, address]
        # After the 0.1 s move to the second replica the whole set gave no answer: from then on the
        # backoff (0.2-0.4 s here), so at most 5 attempts in the first 0.8 s (0.1 s pauses: 8 or 9).
        early = [t for _, t in attempts if t - attempts[0][1] < 0.8]
        assert 3 <= len(early) <= 5, addresses
        assert client.stats.reconnects == len(attempts) - 1 == client.stats.follows


def test_a_lone_server_that_knows_no_primary_yet_is_asked_again_on_its_connection(served: tuple[Shard, str]) -> None:
    _, address = served
    with PSClient([address], LAYOUT, name="lone", config=ClientConfig(retry=FAST)) as client:
        first = client.sessions[0]
        used: list[ShardSession] = []

        def call(session: ShardSession) -> str:
            used.append(session)
            if len(used) < 3:  # an election is running: no primary to name
                raise refusal(grpc.StatusCode.UNAVAILABLE, Reason.NOT_PRIMARY, "electing", {PRIMARY_KEY: ""})
            return session.address

        started = time.monotonic()
        assert client._call(0, call) == address
        assert time.monotonic() - started >= 2 * FOLLOW_PAUSE_S
        assert used == [first, first, first] and client.sessions[0] is first
        assert (client.stats.follows, client.stats.reconnects, client.stats.retries) == (0, 0, 2)
