"""Rollbacks are judged on the shard's own clock (``hetps-shard-clock``), not on a pulled version's.

A shard at its version limit (``pull_versions``) answers a pull with an older version still being
sent to others; that is no rollback. The live tests hold such a version themselves (``Shard.pull``
with the transport's encoder, as the servicer does), so the sharing does not hang on socket
buffers; the restart is a real one, from a state taken earlier, on the same port.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest
import torch

from psproto.layout import Layout
from psproto.metadata import SHARD_CLOCK as SHARD_CLOCK_METADATA
from psproto.v1 import ps_pb2
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.rpc.pull_encoding import PULL_RESPONSE, PUSH_PULL_PARAMS
from psserver.rpc.server import start_server
from psworker.client import ClientConfig, PSClient, RetryPolicy, Rollback
from psworker.sessions import pulled_shard_clock
from psworker.transfer import shard_clock
from tests.psworker.live import serving

LAYOUT = Layout.from_named_shapes([("w", [4])], 1)
FAST = RetryPolicy(give_up_seconds=10.0, initial_backoff=0.001, max_backoff=0.001)
CONFIG = ShardConfig(RuleSpec.parse("asgd", {"lr": "0.1"}), pull_versions=1)


class FakeCall(grpc.Call):
    """A finished call with the given trailing metadata."""

    def __init__(self, trailing: tuple[tuple[str, str | bytes], ...]) -> None:
        self._trailing = trailing

    def initial_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return ()

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._trailing

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.OK

    def details(self) -> str:
        return ""

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 0.0

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False


# -- the decision ---------------------------------------------------------------------------


def test_the_shards_clock_is_read_from_the_trailing_metadata() -> None:
    assert shard_clock(FakeCall((("other", "1"), (SHARD_CLOCK_METADATA, "12")))) == 12
    assert shard_clock(FakeCall(((SHARD_CLOCK_METADATA, b"7"),))) == 7


def test_without_the_metadata_there_is_no_shards_clock() -> None:
    assert shard_clock(FakeCall(())) is None  # an older server
    assert shard_clock(FakeCall(((SHARD_CLOCK_METADATA, "-3"),))) is None
    assert shard_clock(FakeCall(((SHARD_CLOCK_METADATA, "soon"),))) is None


def test_the_shards_clock_decides_over_the_pulled_versions() -> None:
    assert pulled_shard_clock(3, 5) == 5  # an older version shared: the shard is at 5
    assert pulled_shard_clock(3, 5, ack_clock=4) == 5
    # An older server: the version's clock, or PushPull's acknowledgement when higher.
    assert pulled_shard_clock(3, None) == 3
    assert pulled_shard_clock(3, None, ack_clock=4) == 4
    assert pulled_shard_clock(3, None, ack_clock=2) == 3


# -- against a live server ------------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[tuple[Shard, str]]:
    shard = Shard(CONFIG)
    with serving(shard) as address:
        yield shard, address


def test_a_pull_answered_with_an_older_shared_version_is_no_rollback(served: tuple[Shard, str]) -> None:
    shard, address = served
    with PSClient([address], LAYOUT, name="puller", config=ClientConfig(retry=FAST)) as client:
        client.init(torch.zeros(4))
        for _ in range(3):
            client.push(torch.ones(4))
        holder = shard.join("holder", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
        held = shard.pull(holder, ps_pb2.DTYPE_FLOAT32, encoder=PULL_RESPONSE)  # clock 3, in flight
        client.push(torch.ones(4))
        assert client.seen_clocks[0] == shard.clock == 4
        assert client.pull(torch.empty(4)) == held.clock == 3  # the shared version
        assert client.rollbacks == []
        assert client.seen_clocks[0] == 4


def test_a_push_pull_answered_with_an_older_shared_version_is_no_rollback(served: tuple[Shard, str]) -> None:
    shard, address = served
    with PSClient([address], LAYOUT, name="push-puller", config=ClientConfig(retry=FAST)) as client:
        client.init(torch.zeros(4))
        holder = shard.join("holder", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
        held = shard.pull(holder, ps_pb2.DTYPE_FLOAT32, encoder=PUSH_PULL_PARAMS)  # clock 0, in flight
        client.push(torch.ones(4))
        client.push(torch.ones(4), pull_into=torch.empty(4))
        assert client.pulled_clocks[0] == held.clock == 0  # the shared version
        assert client.seen_clocks[0] == shard.clock == 2
        assert client.rollbacks == []


def test_a_pull_from_a_shard_restarted_from_an_older_state_is_a_rollback() -> None:
    shard = Shard(CONFIG)
    running = start_server(shard, "127.0.0.1:0")
    address = f"127.0.0.1:{running.port}"
    try:
        with PSClient([address], LAYOUT, name="survivor", config=ClientConfig(retry=FAST)) as client:
            client.init(torch.zeros(4))
            client.push(torch.ones(4))
            saved = shard.state_dict()  # the checkpoint the shard comes back from, at clock 1
            for _ in range(3):
                client.push(torch.ones(4))
            assert client.seen_clocks[0] == 4
            running.stop(0)
            restored = Shard(CONFIG)
            restored.load_state_dict(saved)
            running = start_server(restored, address)
            assert client.pull(torch.empty(4)) == restored.clock == 1
            assert client.rollbacks == [Rollback(0, 4, 1)]
            assert client.stats.rejoins == 0  # seen by the pull itself: the restored shard knew the worker
    finally:
        running.stop(0)
