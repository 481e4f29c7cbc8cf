"""SerializedPull builds each message on first read, once, and ``freeze`` builds the rest."""

from __future__ import annotations

import threading

import pytest
import torch

from psproto import codec, wire
from psproto.v1 import ps_pb2
from psserver.core.serialized_pull import SerializedPull


class CountingEncoder:
    """A PullEncoder writing PullResponse messages, noting the offset of each message it builds."""

    def __init__(self, calls: list[int]) -> None:
        self.calls = calls

    def encode(self, clock: int, total_length: int, chunk: codec.ChunkPayload) -> bytes:
        self.calls.append(chunk.offset)
        return wire.pull_response(clock, total_length, chunk.offset, chunk.dtype, chunk.data)


def make(source: torch.Tensor, calls: list[int]) -> SerializedPull:
    spans = codec.chunk_spans(source.numel(), ps_pb2.DTYPE_FLOAT32, chunk_bytes=8)
    return SerializedPull(source, 3, ps_pb2.DTYPE_FLOAT32, spans, CountingEncoder(calls))


def values_of(messages: list[bytes]) -> list[float]:
    """The fp32 values PullResponse ``messages`` carry, in order."""
    values: list[float] = []
    for data in messages:
        chunk = ps_pb2.PullResponse.FromString(data).chunk
        values += torch.frombuffer(bytearray(chunk.data), dtype=torch.float32).tolist()
    return values


def parse(messages: list[bytes]) -> list[float]:
    """``values_of`` the messages of the 6-element version of clock 3 that ``make`` builds."""
    for data in messages:
        response = ps_pb2.PullResponse.FromString(data)
        assert (response.clock, response.total_length) == (3, 6)
    return values_of(messages)


def test_messages_are_built_when_read_and_shared_by_readers() -> None:
    calls: list[int] = []
    messages = make(torch.arange(6, dtype=torch.float32), calls)
    assert len(messages) == 3 and calls == [] and not messages.complete
    reader = iter(messages)
    first = next(reader)
    assert calls == [0]
    assert list(messages) == [first, *reader]  # a second reader reuses the built messages
    assert calls == [0, 2, 4] and messages.complete
    assert parse(list(messages)) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_freeze_builds_the_rest_so_the_source_may_change() -> None:
    calls: list[int] = []
    source = torch.arange(6, dtype=torch.float32)
    messages = make(source, calls)
    reader = iter(messages)
    first = next(reader)
    messages.freeze()
    assert calls == [0, 2, 4] and messages.complete
    source.fill_(-1.0)
    assert parse([first, *reader]) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_a_reader_building_a_message_and_freeze_never_build_one_twice() -> None:
    calls: list[int] = []
    messages = make(torch.arange(6, dtype=torch.float32), calls)
    readers = [threading.Thread(target=lambda: list(messages)) for _ in range(4)]
    for reader in readers:
        reader.start()
    messages.freeze()
    for reader in readers:
        reader.join()
    assert sorted(calls) == [0, 2, 4] and messages.complete


def test_a_version_of_a_private_source_keeps_no_messages_and_reads_alike() -> None:
    source = torch.arange(6, dtype=torch.float32)
    spans = codec.chunk_spans(source.numel(), ps_pb2.DTYPE_FLOAT32, chunk_bytes=8)
    calls: list[int] = []
    unretained = SerializedPull(source, 3, ps_pb2.DTYPE_FLOAT32, spans, CountingEncoder(calls), retain=False)
    first, second = list(unretained), list(unretained)
    assert first == second == list(make(source, []))
    assert parse(first) == source.tolist()
    # Each reader's messages are its own: built per read, none kept by the version.
    assert calls == [0, 2, 4, 0, 2, 4] and unretained.retained_bytes == 0
    assert not unretained.complete and not unretained.reads(torch.zeros(6))
    with pytest.raises(RuntimeError, match="private source"):
        unretained.freeze()


def test_a_version_of_the_live_parameters_keeps_what_it_built() -> None:
    version = make(torch.arange(6, dtype=torch.float32), [])
    messages = iter(version)
    first = next(messages)
    assert version.retained_bytes == len(first)
    version.freeze()
    assert version.retained_bytes == sum(len(m) for m in version) and version.complete
