"""Receiving pushes without a shard: decoding into the buffer, buffer limits, stalls."""

from __future__ import annotations

import pytest
import torch

from psproto import codec
from psserver.core.config import ShardConfig
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.observer import NullObserver
from psserver.core.receiving import PendingPush, PushReceiver, check_complete
from psserver.core.refusals import Refusals
from psserver.core.rules import PayloadKind, RuleSpec
from psserver.core.workers import PushOutcome, WorkerRecord


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def receiver(clock: FakeClock, **limits: float) -> tuple[PushReceiver, Refusals]:
    config = ShardConfig(RuleSpec.parse("asgd", {}), **limits)  # type: ignore[arg-type]
    refusals = Refusals(NullObserver())
    return PushReceiver(refusals, clock, config), refusals


def open_push(
    push_receiver: PushReceiver, replay: PushOutcome | None = None, holder: bool = False, cancel: object = None
) -> PendingPush:
    worker = WorkerRecord(1, "a", "cpu", False)
    on_cancel = cancel if callable(cancel) else None
    return push_receiver.open(worker, 1, 0, PayloadKind.GRADIENT, {}, 4, replay, holder, on_cancel)


def test_chunks_are_decoded_into_the_receive_buffer_and_it_is_given_back() -> None:
    push_receiver, _ = receiver(FakeClock())
    pending = open_push(push_receiver)
    for chunk in codec.encode(torch.arange(4, dtype=torch.float32), chunk_bytes=8):
        pending.add(chunk)
    assert pending.bytes_received == 16 and pending.buffers.in_use == 1
    assembler = pending.decoder()
    check_complete(assembler, push_receiver.refusals)
    assert torch.equal(assembler.out, torch.arange(4, dtype=torch.float32))
    push_receiver.discard(pending)
    push_receiver.discard(pending)  # safe twice
    assert pending.buffers.in_use == 0


def test_a_replayed_push_ignores_its_chunks_and_takes_no_buffer() -> None:
    push_receiver, _ = receiver(FakeClock())
    pending = open_push(push_receiver, replay=PushOutcome(3, 0, {}))
    for chunk in codec.encode(torch.ones(4)):
        pending.add(chunk)
    assert pending.assembler is None and pending.buffers.in_use == 0


def test_a_bad_chunk_is_refused_with_its_kind() -> None:
    push_receiver, refusals = receiver(FakeClock())
    pending = open_push(push_receiver)
    with pytest.raises(ShardError) as refused:
        pending.add(codec.ChunkPayload(3, codec.FLOAT32, memoryview(bytes(8))))
    assert refused.value.kind is ErrorKind.CHUNK_OUT_OF_RANGE and refusals.counts() == {"chunk_out_of_range": 1}


def test_no_free_buffer_in_time_is_refused_but_a_reservation_holder_never_waits() -> None:
    push_receiver, _ = receiver(FakeClock(), receive_buffers=1, receive_wait_seconds=0.05)
    first = open_push(push_receiver)
    first.decoder()
    with pytest.raises(ShardError) as refused:
        open_push(push_receiver).decoder()
    assert refused.value.kind is ErrorKind.LIMIT_REACHED
    holder = open_push(push_receiver, holder=True)
    holder.decoder()
    assert holder.buffers.in_use == 2


def test_a_push_silent_too_long_is_cancelled_once_and_then_reported_as_stalled() -> None:
    clock = FakeClock()
    push_receiver, refusals = receiver(clock, receive_idle_seconds=5.0)
    cancelled: list[bool] = []
    pending = open_push(push_receiver, cancel=lambda: cancelled.append(True))
    pending.add(next(codec.encode(torch.ones(4), chunk_bytes=8)))
    clock.now = 4.0
    assert push_receiver.cancel_stalled() == []
    clock.now = 6.0
    assert push_receiver.cancel_stalled() == [pending] and cancelled == [True]
    assert push_receiver.cancel_stalled() == []
    stalled = push_receiver.stalled(pending)
    assert stalled is not None and stalled.kind is ErrorKind.PUSH_STALLED and stalled.counted
    assert refusals.counts() == {"push_stalled": 1}


def test_a_push_whose_stream_ended_is_no_longer_watched() -> None:
    clock = FakeClock()
    push_receiver, _ = receiver(clock, receive_idle_seconds=5.0)
    pending = open_push(push_receiver)
    pending.decoder()
    assert push_receiver.stalled(pending) is None
    clock.now = 10.0
    assert push_receiver.cancel_stalled() == []
