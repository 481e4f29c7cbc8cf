"""The coordinator's watch without etcd: a stand-in for the stream etcd's gateway answers a watch with
(its real one: tests/integration/test_etcd_integ.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from etcd3gw.exceptions import ConnectionFailedError, ConnectionTimeoutError

from psserver.replication.config import ReplicationConfig
from psserver.replication.coordinator import Coordinator, EtcdError, KeyWatch, _prefix_end


class Stream:
    """A watch's response: its lines, then the end (``error`` raised, as a cut connection does)."""

    def __init__(self, lines: list[bytes], error: Exception | None = None) -> None:
        self.lines, self.error = lines, error
        self.more = threading.Event()
        self.closed = False
        self.raw = SimpleNamespace(connection=None)

    def iter_lines(self) -> Iterator[bytes]:
        yield from self.lines
        self.more.wait(5)
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.closed = True


def test_every_line_of_the_stream_wakes_the_replica_and_so_does_its_end() -> None:
    changed = threading.Event()
    stream = Stream([b'{"result":{"created":true}}', b""], ConnectionResetError("cut"))
    watch = KeyWatch(stream, changed)
    assert changed.wait(5) and watch.alive
    changed.clear()
    stream.more.set()  # the connection breaks
    assert changed.wait(5)
    for _ in range(100):
        if not watch.alive:
            break
        changed.wait(0.05)
    assert not watch.alive
    watch.close()
    assert stream.closed


def test_the_range_watched_is_the_shards_keys_and_no_other_shards() -> None:
    prefix = "/hetps/job/shard/1/"
    end = _prefix_end(prefix)
    inside = [prefix + "primary", prefix + "replicas/127.0.0.1:1/ab"]
    outside = ["/hetps/job/shard/10/primary", "/hetps/job/shard/2/primary", "/hetps/job/shard/1"]
    assert all(prefix <= key < end for key in inside)
    assert not any(prefix <= key < end for key in outside)


class Endpoint:
    """An etcd client stand-in whose every request fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error, self.base_url = error, "http://etcd:2379"

    def lease(self, ttl: int) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("errors", "timed_out"),
    [
        ([ConnectionTimeoutError("Read timed out")], True),
        ([ConnectionTimeoutError("Read timed out"), ConnectionTimeoutError("Read timed out")], True),
        ([ConnectionTimeoutError("Read timed out"), ConnectionFailedError("Connection refused")], False),
        ([ConnectionFailedError("Connection refused")], False),
    ],
)
def test_an_etcd_that_every_endpoint_was_slow_to_answer_is_told_from_one_that_is_unreachable(
    errors: list[Exception], timed_out: bool
) -> None:
    config = ReplicationConfig(etcd=tuple(f"http://127.0.0.1:{2379 + i}" for i in range(len(errors))))
    coordinator = Coordinator(config, 0, "a", "127.0.0.1:1")
    coordinator._clients = [Endpoint(error) for error in errors]  # type: ignore[misc]
    with pytest.raises(EtcdError) as raised:
        coordinator.grant()
    assert raised.value.timed_out is timed_out
    assert "no etcd endpoint answered" in str(raised.value)
