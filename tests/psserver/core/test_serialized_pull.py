"""SerializedPull builds each message on first read, once, and ``freeze`` builds the rest."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import pytest
import torch

from psproto import codec, wire
from psproto.v1 import ps_pb2
from psserver.core import serialized_pull
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


class PendingUpdate:
    """A ``before_read`` hook: ``update`` applied to the source's elements not yet brought up to date."""

    def __init__(self, source: torch.Tensor, update: Callable[[torch.Tensor], object]) -> None:
        self.source = source
        self.update = update
        self.stops: list[int] = []

    def __call__(self, stop: int) -> None:
        start = self.stops[-1] if self.stops else 0
        if stop > start:
            self.stops.append(stop)
            self.update(self.source[start:stop])


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


def test_before_read_brings_each_range_up_to_date_and_is_refused_for_a_private_source() -> None:
    source = torch.arange(6, dtype=torch.float32)
    spans = codec.chunk_spans(source.numel(), ps_pb2.DTYPE_FLOAT32, chunk_bytes=8)
    before_read = PendingUpdate(source, lambda elements: elements.add_(10.0))
    version = SerializedPull(source, 3, ps_pb2.DTYPE_FLOAT32, spans, CountingEncoder([]), before_read=before_read)
    assert parse(list(version)) == [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    assert before_read.stops == [2, 4, 6]
    with pytest.raises(ValueError, match="only a version of the live parameters"):
        SerializedPull(source, 3, ps_pb2.DTYPE_FLOAT32, spans, CountingEncoder([]), retain=False, before_read=print)


class HeldBuilder(Executor):
    """An Executor whose submitted work runs only when the test says so."""

    def __init__(self) -> None:
        self.work: list[Callable[[], object]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.work.append(lambda: fn(*args, **kwargs))
        return Future()


def test_the_builder_builds_the_rest_once_the_first_reader_starts_and_readers_reuse_it() -> None:
    calls: list[int] = []
    source = torch.arange(6, dtype=torch.float32)
    spans = codec.chunk_spans(source.numel(), ps_pb2.DTYPE_FLOAT32, chunk_bytes=8)
    builder = HeldBuilder()
    version = SerializedPull(source, 3, ps_pb2.DTYPE_FLOAT32, spans, CountingEncoder(calls), builder=builder)
    assert builder.work == []  # nothing is built for a version nobody reads
    reader = iter(version)
    first = next(reader)
    assert calls == [0] and len(builder.work) == 1
    builder.work[0]()
    assert calls == [0, 2, 4] and version.complete
    source.fill_(-1.0)  # the source is no longer read
    assert parse([first, *reader]) == parse(list(version)) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert len(builder.work) == 1 and calls == [0, 2, 4]
    with pytest.raises(ValueError, match="only a version of the live parameters keeps messages built ahead"):
        SerializedPull(source, 3, ps_pb2.DTYPE_FLOAT32, spans, CountingEncoder([]), retain=False, builder=builder)


def test_a_builder_thread_readers_and_freeze_build_each_message_once_and_in_order_of_its_source() -> None:
    source = torch.arange(4096, dtype=torch.float32)
    spans = codec.chunk_spans(source.numel(), ps_pb2.DTYPE_FLOAT32, chunk_bytes=64)
    for _ in range(20):
        source.copy_(torch.arange(4096, dtype=torch.float32))
        before_read = PendingUpdate(source, lambda elements: elements.mul_(2.0))
        calls: list[int] = []
        with ThreadPoolExecutor(1) as builder:
            version = SerializedPull(
                source, 3, ps_pb2.DTYPE_FLOAT32, spans, CountingEncoder(calls), before_read=before_read, builder=builder
            )
            got: list[list[bytes]] = [[], [], []]
            readers = [threading.Thread(target=lambda out=out, v=version: out.extend(v)) for out in got]
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join()
            version.freeze()
        assert sorted(calls) == [span.start for span in spans] and version.complete
        expected = (torch.arange(4096, dtype=torch.float32) * 2.0).tolist()
        assert [values_of(messages) for messages in got] == [expected] * 3


def test_the_builder_stays_a_few_messages_ahead_of_the_reader_and_leaves_a_quiet_one_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(serialized_pull, "READER_QUIET_SECONDS", 0.3)
    calls: list[int] = []
    source = torch.arange(40, dtype=torch.float32)
    spans = codec.chunk_spans(source.numel(), ps_pb2.DTYPE_FLOAT32, chunk_bytes=8)  # 20 messages
    builder = HeldBuilder()
    version = SerializedPull(source, 3, ps_pb2.DTYPE_FLOAT32, spans, CountingEncoder(calls), builder=builder)
    reader = iter(version)
    next(reader)
    next(reader)
    running = threading.Thread(target=builder.work[0])
    running.start()
    running.join(5)  # the reader took 2 messages and went quiet: the builder stops 4 past them
    assert not running.is_alive()
    assert calls == [0, 2, 4, 6, 8, 10]
    assert values_of([*reader]) == source[4:].tolist()  # the reader builds what the builder left
    assert sorted(calls) == [span.start for span in spans] and version.complete


def test_a_builder_leaves_once_freeze_built_everything_though_its_reader_is_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(serialized_pull, "READER_QUIET_SECONDS", 30.0)
    source = torch.arange(40, dtype=torch.float32)
    spans = codec.chunk_spans(source.numel(), ps_pb2.DTYPE_FLOAT32, chunk_bytes=8)  # 20 messages
    with ThreadPoolExecutor(1) as builder:
        version = SerializedPull(source, 3, ps_pb2.DTYPE_FLOAT32, spans, CountingEncoder([]), builder=builder)
        reader = iter(version)
        next(reader)  # the builder runs 4 past it, then waits for the reader
        version.freeze()  # an update is coming: everything is built now
        later = SerializedPull(source, 4, ps_pb2.DTYPE_FLOAT32, spans, CountingEncoder([]), builder=builder)
        started = time.monotonic()
        builder.submit(lambda: None).result(timeout=5)  # the builder thread is free again
        assert time.monotonic() - started < 5 and version.complete
        assert values_of(list(later)) == source.tolist()


def test_a_builder_that_fails_logs_why_and_its_reader_meets_the_failure_too(caplog: pytest.LogCaptureFixture) -> None:
    source = torch.arange(6, dtype=torch.float32)
    spans = codec.chunk_spans(source.numel(), ps_pb2.DTYPE_FLOAT32, chunk_bytes=8)

    def before_read(stop: int) -> None:
        if threading.current_thread() is not threading.main_thread() or stop > 2:
            raise RuntimeError("the span's apply failed")

    with ThreadPoolExecutor(1) as builder:
        version = SerializedPull(
            source, 3, ps_pb2.DTYPE_FLOAT32, spans, CountingEncoder([]), before_read=before_read, builder=builder
        )
        reader = iter(version)
        next(reader)
        builder.submit(lambda: None).result(timeout=5)  # the builder has run (and failed)
    assert "building a reply ahead of its sending failed" in caplog.text
    assert "the span's apply failed" in caplog.text
    with pytest.raises(RuntimeError, match="the span's apply failed"):
        next(reader)


def test_a_version_whose_builders_were_stopped_or_shut_down_is_built_by_its_readers() -> None:
    source = torch.arange(6, dtype=torch.float32)
    spans = codec.chunk_spans(source.numel(), ps_pb2.DTYPE_FLOAT32, chunk_bytes=8)
    builder = HeldBuilder()
    stopped = SerializedPull(source, 3, ps_pb2.DTYPE_FLOAT32, spans, CountingEncoder([]), builder=builder)
    stopped.stop_building()
    assert values_of(list(stopped)) == source.tolist() and builder.work == []
    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    unscheduled = SerializedPull(source, 3, ps_pb2.DTYPE_FLOAT32, spans, CountingEncoder([]), builder=pool)
    assert values_of(list(unscheduled)) == source.tolist()
