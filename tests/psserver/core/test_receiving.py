"""Receiving pushes without a shard: decoding into the buffer, buffer limits and shares, and the
limits that end a push (idle, pace), on an injected clock."""

from __future__ import annotations

import threading

import pytest
import torch

from psproto import codec
from psproto.reasons import TransientLimit
from psserver.core.config import ShardConfig
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.observer import NullObserver
from psserver.core.pace import TransferPace
from psserver.core.receiving import (
    MAX_OPEN_PUSHES_PER_WORKER,
    SIT_OUT_GRACES,
    Limit,
    PendingPush,
    PushHeader,
    PushReceiver,
    check_complete,
)
from psserver.core.refusals import Refusals
from psserver.core.rules import RuleSpec
from psserver.core.workers import PushOutcome, WorkerRecord

# 1000 elements: a 4000-byte fp32 push.
LENGTH = 1000
# 1000 bytes a second after 2 s: the whole push may take 2 + 4 = 6 s.
PACE = TransferPace(min_bytes_per_s=1000.0, grace_s=2.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def receiver(clock: FakeClock, **limits: object) -> tuple[PushReceiver, Refusals]:
    limits.setdefault("transfer_pace", PACE)
    config = ShardConfig(RuleSpec.parse("asgd", {}), **limits)  # type: ignore[arg-type]
    refusals = Refusals(NullObserver())
    return PushReceiver(refusals, clock, config), refusals


def open_push(
    push_receiver: PushReceiver,
    name: str = "a",
    replay: PushOutcome | None = None,
    holder: bool = False,
    cancel: object = None,
) -> PendingPush:
    worker = WorkerRecord(ord(name[0]), name, "cpu", False)
    on_cancel = cancel if callable(cancel) else None
    return push_receiver.open(worker, PushHeader(worker.worker_id, 1, 0), LENGTH, replay, holder, on_cancel)


def chunks(chunk_bytes: int) -> list[codec.ChunkPayload]:
    return list(codec.encode(torch.ones(LENGTH), chunk_bytes=chunk_bytes))


def test_pace_gives_each_byte_a_deadline() -> None:
    assert PACE.deadline_s(4000) == 6.0
    assert not PACE.behind(0, 2.0)  # the grace
    assert PACE.behind(0, 2.1) and not PACE.behind(200, 2.1)
    assert not PACE.behind(4000, 6.0) and PACE.behind(3999, 6.0)
    with pytest.raises(ValueError, match="positive rate"):
        TransferPace(0.0)


def test_chunks_are_decoded_into_the_receive_buffer_and_it_is_given_back() -> None:
    push_receiver, _ = receiver(FakeClock())
    pending = open_push(push_receiver)
    for chunk in codec.encode(torch.arange(LENGTH, dtype=torch.float32), chunk_bytes=800):
        pending.add(chunk)
    assert pending.bytes_received == 4000 and pending.buffers.in_use == 1
    assembler = pending.decoder()
    check_complete(assembler, push_receiver.refusals)
    assert torch.equal(assembler.out, torch.arange(LENGTH, dtype=torch.float32))
    push_receiver.discard(pending)
    push_receiver.discard(pending)  # safe twice
    assert pending.buffers.in_use == 0


def test_a_replayed_push_ignores_its_chunks_and_takes_no_buffer() -> None:
    push_receiver, _ = receiver(FakeClock())
    pending = open_push(push_receiver, replay=PushOutcome(3, 0, {}))
    for chunk in chunks(4000):
        pending.add(chunk)
    assert pending.assembler is None and pending.buffers.in_use == 0


def test_a_bad_chunk_is_refused_with_its_kind() -> None:
    push_receiver, refusals = receiver(FakeClock())
    pending = open_push(push_receiver)
    with pytest.raises(ShardError) as refused:
        pending.add(codec.ChunkPayload(LENGTH - 1, codec.FLOAT32, memoryview(bytes(8))))
    assert refused.value.kind is ErrorKind.CHUNK_OUT_OF_RANGE and refusals.counts() == {"chunk_out_of_range": 1}


def test_no_free_buffer_in_time_is_refused_but_a_reservation_holder_never_waits() -> None:
    push_receiver, _ = receiver(FakeClock(), receive_buffers=1, receive_wait_seconds=0.05)
    open_push(push_receiver, "a").decoder()
    with pytest.raises(ShardError) as refused:
        open_push(push_receiver, "b").decoder()
    assert refused.value.kind is ErrorKind.LIMIT_REACHED and "shard.receive_buffers" in refused.value.message
    # A limit that passes on its own, and says so: clients retry it.
    assert refused.value.metadata == {"limit": TransientLimit.RECEIVE_BUFFERS.value}
    holder = open_push(push_receiver, "c", holder=True)
    holder.decoder()
    assert holder.buffers.in_use == 2


def test_a_worker_holds_one_buffer_its_second_push_waits_for_its_first() -> None:
    push_receiver, _ = receiver(FakeClock(), receive_buffers=4, receive_wait_seconds=0.05)
    first = open_push(push_receiver, "a")
    first.decoder()
    # Free buffers, but not for worker a: not even as the reservation holder.
    for holder in (False, True):
        refused_push = open_push(push_receiver, "a", holder=holder)
        with pytest.raises(ShardError) as refused:
            refused_push.decoder()
        assert refused.value.kind is ErrorKind.LIMIT_REACHED and "one at a time" in refused.value.message
        assert refused.value.metadata == {"limit": TransientLimit.RECEIVE_BUFFERS.value}
        push_receiver.discard(refused_push)  # what the transport does when the handler ends
    assert open_push(push_receiver, "b").decoder() is not None  # another worker is not held up
    second = open_push(push_receiver, "a")
    push_receiver._wait_seconds = 10.0
    waiter = threading.Thread(target=second.decoder)
    waiter.start()
    push_receiver.discard(first)
    waiter.join(10)
    assert not waiter.is_alive() and second.assembler is not None


def test_a_worker_has_at_most_two_pushes_receiving() -> None:
    push_receiver, refusals = receiver(FakeClock())
    opened = [open_push(push_receiver, "a") for _ in range(MAX_OPEN_PUSHES_PER_WORKER)]
    with pytest.raises(ShardError) as refused:
        open_push(push_receiver, "a")
    assert refused.value.kind is ErrorKind.LIMIT_REACHED and "one push at a time" in refused.value.message
    assert refused.value.metadata == {"limit": TransientLimit.OPEN_PUSHES_PER_WORKER.value}
    assert refusals.counts() == {"limit_reached": 1}
    open_push(push_receiver, "b")
    push_receiver.discard(opened[0])
    open_push(push_receiver, "a")  # its slot came back when the stream ended


def test_a_trickling_push_is_ended_after_the_grace_and_its_buffer_freed_at_once() -> None:
    clock = FakeClock()
    push_receiver, refusals = receiver(clock, receive_idle_seconds=5.0)
    cancelled: list[bool] = []
    pending = open_push(push_receiver, cancel=lambda: cancelled.append(True))
    trickle = iter(chunks(4))
    for _ in range(20):  # 4 bytes every 0.25 s: far below 1000 bytes a second
        pending.add(next(trickle))
        clock.now += 0.25
        if push_receiver.cancel_stalled():
            break
    assert clock.now == pytest.approx(2.25)  # ended at the first check past the grace
    assert pending.ended is Limit.PACE and pending.buffers.in_use == 0 and cancelled == []
    assert refusals.counts() == {"push_stalled": 1}
    # Its next chunk is refused with the limit that ended it; it is never applied.
    with pytest.raises(ShardError) as refused:
        pending.add(next(trickle))
    error = refused.value
    assert error.kind is ErrorKind.PUSH_STALLED and error.counted and error.metadata == {"limit": "min_transfer_rate"}
    assert "shard.transfer_pace" in error.message
    stalled = push_receiver.stalled(pending)
    assert stalled is not None and stalled.metadata == {"limit": "min_transfer_rate"}
    assert refusals.counts() == {"push_stalled": 1}  # counted once


def test_a_worker_whose_push_was_too_slow_sits_out_before_its_next_push_is_received() -> None:
    clock = FakeClock()
    push_receiver, refusals = receiver(clock, receive_idle_seconds=50.0)
    slow = open_push(push_receiver, "a")
    slow.add(chunks(4)[0])
    clock.now = 2.5
    assert push_receiver.cancel_stalled() == [slow]
    push_receiver.discard(slow)
    back_at = 2.5 + SIT_OUT_GRACES * PACE.grace_s
    clock.now = back_at - 0.5
    with pytest.raises(ShardError) as refused:
        open_push(push_receiver, "a")
    error = refused.value
    assert error.kind is ErrorKind.PUSH_STALLED and error.counted and "retry in 0.5 s" in error.message
    assert error.metadata == {"limit": "sit_out", "retry_after_s": "0.500"}
    assert refusals.counts() == {"push_stalled": 2}
    open_push(push_receiver, "b")  # other workers are not held up
    clock.now = back_at
    open_push(push_receiver, "a")


def test_an_ended_push_that_goes_silent_is_cancelled_without_counting_it_again() -> None:
    clock = FakeClock()
    push_receiver, refusals = receiver(clock, receive_idle_seconds=5.0)
    cancelled: list[bool] = []
    pending = open_push(push_receiver, cancel=lambda: cancelled.append(True))
    pending.add(chunks(4)[0])
    clock.now = 3.0
    assert push_receiver.cancel_stalled() == [pending] and cancelled == []
    clock.now = 6.0
    assert push_receiver.cancel_stalled() == [pending] and cancelled == [True]
    assert push_receiver.cancel_stalled() == []
    assert refusals.counts() == {"push_stalled": 1}


def test_a_push_at_the_pace_is_never_ended_and_holds_its_buffer_at_most_its_deadline() -> None:
    clock = FakeClock()
    push_receiver, _ = receiver(clock, receive_idle_seconds=5.0)
    pending = open_push(push_receiver)
    # 400 bytes every 0.4 s (exactly 1000 bytes a second), starting at the end of the grace.
    clock.now = 2.0
    for chunk in chunks(400):
        pending.add(chunk)
        clock.now += 0.4
        assert push_receiver.cancel_stalled() == []
    assert clock.now == pytest.approx(PACE.deadline_s(4000))
    assert push_receiver.stalled(pending) is None and pending.ended is None


def test_a_push_waiting_for_a_buffer_is_not_ended_by_the_wait() -> None:
    clock = FakeClock()
    push_receiver, _ = receiver(clock, receive_buffers=1, receive_idle_seconds=5.0, receive_wait_seconds=10.0)
    holding = open_push(push_receiver, "a")
    holding.decoder()
    waiting = open_push(push_receiver, "b")
    waiter = threading.Thread(target=lambda: waiting.add(chunks(4000)[0]))
    waiter.start()
    while not waiting.waiting:
        threading.Event().wait(0.01)
    clock.now = 100.0  # the holder is long past both limits; the waiter is waiting for the server
    assert push_receiver.cancel_stalled() == [holding]
    waiter.join(10)
    # It took the holder's buffer, and its pace counts from then.
    assert waiting.receiving_since == 100.0 and waiting.ended is None and waiting.assembler is not None


def test_a_push_that_sends_only_its_header_is_cancelled_once_idle() -> None:
    clock = FakeClock()
    push_receiver, refusals = receiver(clock, receive_idle_seconds=5.0)
    cancelled: list[bool] = []
    pending = open_push(push_receiver, cancel=lambda: cancelled.append(True))
    clock.now = 4.0
    assert push_receiver.cancel_stalled() == []
    clock.now = 6.0
    assert push_receiver.cancel_stalled() == [pending] and cancelled == [True]
    stalled = push_receiver.stalled(pending)
    assert stalled is not None and stalled.metadata == {"limit": "receive_idle_seconds"}
    assert "sent nothing for 5 s" in stalled.message and refusals.counts() == {"push_stalled": 1}


def test_a_trickling_replay_is_ended_too() -> None:
    clock = FakeClock()
    push_receiver, _ = receiver(clock, receive_idle_seconds=5.0)
    pending = open_push(push_receiver, replay=PushOutcome(3, 0, {}))
    pending.add(chunks(4)[0])
    clock.now = 3.0
    assert push_receiver.cancel_stalled() == [pending] and pending.ended is Limit.PACE


def test_a_push_whose_stream_ended_is_no_longer_watched() -> None:
    clock = FakeClock()
    push_receiver, _ = receiver(clock, receive_idle_seconds=5.0)
    pending = open_push(push_receiver)
    pending.decoder()
    assert push_receiver.stalled(pending) is None
    clock.now = 10.0
    assert push_receiver.cancel_stalled() == []


def test_past_max_receiving_pushes_a_push_is_refused_at_its_header_with_a_limit_to_retry() -> None:
    push_receiver, refusals = receiver(FakeClock(), max_receiving_pushes=2)
    first, second = open_push(push_receiver, "a"), open_push(push_receiver, "b")
    with pytest.raises(ShardError) as refused:
        open_push(push_receiver, "c")
    assert refused.value.kind is ErrorKind.LIMIT_REACHED and "shard.max_receiving_pushes" in refused.value.message
    assert refused.value.metadata == {"limit": TransientLimit.RECEIVING_PUSHES.value}
    assert refusals.counts() == {"limit_reached": 1}
    # A reservation holder is never turned away (the others wait on its push).
    open_push(push_receiver, "d", holder=True)
    push_receiver.discard(first)
    with pytest.raises(ShardError):
        open_push(push_receiver, "c")  # still 2 open besides the holder's: a, gone; b and d remain
    push_receiver.discard(second)
    open_push(push_receiver, "c")  # a slot came back when a stream ended


def test_without_max_receiving_pushes_any_number_are_open() -> None:
    push_receiver, refusals = receiver(FakeClock())
    for name in "abcdefghij":
        open_push(push_receiver, name)
    assert refusals.counts() == {}
