"""SerializedPull builds each message for its reader when read, and ``freeze`` copies a live source once."""

from __future__ import annotations

import threading

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


def make(
    source: torch.Tensor, calls: list[int], dtype: int = ps_pb2.DTYPE_FLOAT32, live: bool = True
) -> SerializedPull:
    spans = codec.chunk_spans(source.numel(), dtype, chunk_bytes=8)
    return SerializedPull(source, 3, dtype, spans, CountingEncoder(calls), live)


def values_of(messages: list[bytes]) -> list[float]:
    """The values PullResponse ``messages`` carry, in order."""
    values: list[float] = []
    for data in messages:
        chunk = ps_pb2.PullResponse.FromString(data).chunk
        dtype = codec.wire_dtype(chunk.dtype)
        values += torch.frombuffer(bytearray(chunk.data), dtype=dtype).float().tolist()
    return values


def parse(messages: list[bytes]) -> list[float]:
    """``values_of`` the messages of the 6-element version of clock 3 that ``make`` builds."""
    for data in messages:
        response = ps_pb2.PullResponse.FromString(data)
        assert (response.clock, response.total_length) == (3, 6)
    return values_of(messages)


def test_each_reader_builds_its_own_messages_as_it_reads_and_none_are_kept() -> None:
    calls: list[int] = []
    messages = make(torch.arange(6, dtype=torch.float32), calls)
    assert len(messages) == 3 and calls == []
    reader = iter(messages)
    first = next(reader)
    assert calls == [0]
    assert list(messages) == [first, *reader]
    assert calls == [0, 0, 2, 4, 2, 4]
    assert parse(list(messages)) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert messages.frozen_bytes == 0


def test_freeze_copies_the_live_source_once_so_it_may_change() -> None:
    calls: list[int] = []
    source = torch.arange(6, dtype=torch.float32)
    messages = make(source, calls)
    assert not messages.reads(source)  # nobody was handed it
    messages.hand_out()
    reader = iter(messages)
    first = next(reader)
    assert messages.reads(source)
    messages.freeze()
    messages.freeze()  # frozen already: no second copy
    assert not messages.reads(source) and messages.frozen_bytes == 6 * 4
    source.fill_(-1.0)
    assert parse([first, *reader]) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert parse(list(messages)) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # a reader that starts after it too


def test_a_frozen_copy_is_in_the_wire_dtype() -> None:
    source = torch.arange(6, dtype=torch.float32)
    messages = make(source, [], ps_pb2.DTYPE_BFLOAT16)
    messages.hand_out()
    messages.freeze()
    source.fill_(-1.0)
    assert messages.frozen_bytes == 6 * 2
    assert parse(list(messages)) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_readers_building_messages_while_the_source_is_frozen_and_changed_read_one_version() -> None:
    source = torch.arange(60_000, dtype=torch.float32)
    spans = codec.chunk_spans(source.numel(), ps_pb2.DTYPE_FLOAT32, chunk_bytes=4096)
    messages = SerializedPull(source, 3, ps_pb2.DTYPE_FLOAT32, spans, CountingEncoder([]), live=True)
    read: list[list[bytes]] = []
    readers = [threading.Thread(target=lambda: read.append(list(messages))) for _ in range(4)]
    for _ in readers:
        messages.hand_out()
    for reader in readers:
        reader.start()
    messages.freeze()
    source.fill_(-1.0)
    for reader in readers:
        reader.join()
    expected = torch.arange(60_000, dtype=torch.float32).tolist()
    assert len(read) == 4 and all(values_of(got) == expected for got in read)


def test_a_version_every_reader_read_to_the_end_reads_the_source_no_more() -> None:
    source = torch.arange(6, dtype=torch.float32)
    messages = make(source, [])
    messages.hand_out()
    messages.hand_out()
    list(messages)
    assert messages.reads(source)  # one reader still to read it
    reader = iter(messages)
    next(reader)
    reader.close()  # a reply cancelled half-way is done with it too
    assert not messages.reads(source)


def test_a_version_of_a_private_source_reads_it_and_is_never_copied() -> None:
    source = torch.arange(6, dtype=torch.float32)
    calls: list[int] = []
    private = make(source, calls, live=False)
    first, second = list(private), list(private)
    assert first == second and parse(first) == source.tolist()
    assert calls == [0, 2, 4, 0, 2, 4]
    private.hand_out()
    assert not private.reads(source)
    private.freeze()
    assert private.frozen_bytes == 0
