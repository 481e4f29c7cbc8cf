"""A backup's side of a Replicate call, without a network: what it holds, what it refuses and why."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
import pytest
import torch

from psproto import wire
from psproto.errors import Reason
from psproto.v1 import ps_pb2
from psserver.replication import state_wire
from psserver.replication.standby import DATA_FIELD, Standby


class RefusedError(Exception):
    def __init__(self, status: grpc.Status) -> None:
        super().__init__(status.details)
        self.status = status


class Context:
    async def abort_with_status(self, status: grpc.Status) -> None:
        raise RefusedError(status)


async def _stream(messages: Iterable[bytes]) -> AsyncIterator[bytes]:
    for message in messages:
        yield message


def _call(standby: Standby, messages: list[bytes]) -> Any:
    return asyncio.run(standby.replicate(_stream(messages), Context()))


def _messages(epoch: int, version: int, digest: bool = False) -> list[bytes]:
    encoded = state_wire.encode({"params": torch.arange(10.0), "rule_state": {}, "clock": version})
    header = ps_pb2.ReplicateHeader(
        epoch=epoch, version=version, clock=version, primary="p", total_bytes=encoded.total_bytes,
        digest=encoded.digest() if digest else "",
    )  # fmt: skip
    data = b"".join(bytes(part) for part in encoded.parts)
    return [ps_pb2.ReplicateRequest(header=header).SerializeToString(), wire.length_delimited(DATA_FIELD, data)]


def test_a_backup_holds_the_state_sent_and_checks_its_digest() -> None:
    standby = Standby(lambda: False)
    reply = _call(standby, _messages(epoch=1, version=7, digest=True))
    assert (reply.version, reply.digest_checked, reply.digest_matches) == (7, True, True)
    assert standby.held is not None and standby.held.version == 7
    assert torch.equal(standby.held.state["params"], torch.arange(10.0))


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([], "must start with its header"),
        ([b"\x12\x01x"], "must start with its header"),
        ([b"\x0a\x02\xff\xff"], "does not parse"),
    ],
)
def test_a_malformed_stream_is_refused_and_nothing_is_held(messages: list[bytes], problem: str) -> None:
    standby = Standby(lambda: False)
    with pytest.raises(RefusedError, match=problem) as refused:
        _call(standby, messages)
    assert refused.value.status.code is grpc.StatusCode.INVALID_ARGUMENT
    assert standby.held is None


def test_a_stream_shorter_or_longer_than_its_header_says_is_refused() -> None:
    standby = Standby(lambda: False)
    header, data = _messages(epoch=1, version=1)
    with pytest.raises(RefusedError, match="state bytes came") as short:
        _call(standby, [header])
    assert short.value.status.code is grpc.StatusCode.DATA_LOSS
    with pytest.raises(RefusedError, match="longer than its header"):
        _call(standby, [header, data, data])
    assert standby.held is None


def test_an_older_epoch_is_fenced_and_a_primary_takes_no_state() -> None:
    standby = Standby(lambda: False)
    _call(standby, _messages(epoch=3, version=1))
    with pytest.raises(RefusedError, match="older than 3") as stale:
        _call(standby, _messages(epoch=2, version=9))
    assert stale.value.status.code is grpc.StatusCode.FAILED_PRECONDITION
    assert Reason.STALE_EPOCH.value.encode() in stale.value.status.trailing_metadata[0][1]
    assert standby.held is not None and standby.held.version == 1
    primary = Standby(lambda: True)
    with pytest.raises(RefusedError, match="this replica is the primary"):
        _call(primary, _messages(epoch=5, version=1))
