"""Init uploads and pull replies held to the push limits, on an injected clock."""

from __future__ import annotations

from psserver.core.observer import NullObserver
from psserver.core.pace import TransferPace
from psserver.core.refusals import Refusals
from psserver.core.stream_watch import StreamWatch, WatchedStream
from psserver.core.workers import WorkerRecord

# 1000 bytes a second after 2 s; idle after 5 s.
PACE = TransferPace(min_bytes_per_s=1000.0, grace_s=2.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watched(clock: FakeClock) -> tuple[StreamWatch, WatchedStream, list[str], Refusals]:
    refusals = Refusals(NullObserver())
    watch = StreamWatch(refusals, clock, idle_s=5.0, pace=PACE)
    cancelled: list[str] = []
    stream = watch.watch(WorkerRecord(1, "a", "cpu", False), "Pull", lambda: cancelled.append("Pull"))
    return watch, stream, cancelled, refusals


def test_a_stream_at_the_pace_is_left_alone_and_a_closed_one_is_forgotten() -> None:
    clock = FakeClock()
    watch, stream, cancelled, _ = watched(clock)
    for _ in range(10):
        clock.now += 1.0
        stream.moved(1000)
        assert watch.cancel_slow() == []
    stream.close()
    stream.close()  # safe twice
    clock.now += 100.0
    assert watch.cancel_slow() == [] and cancelled == []


def test_a_reader_that_stops_reading_is_cancelled_once_idle_and_counted() -> None:
    clock = FakeClock()
    watch, stream, cancelled, refusals = watched(clock)
    stream.moved(10_000_000)  # far ahead of the pace: only idleness can end it
    clock.now = 5.0
    assert watch.cancel_slow() == []
    clock.now = 5.5
    assert watch.cancel_slow() == [stream] and cancelled == ["Pull"]
    assert stream.cancelled_for == "receive_idle_seconds" and refusals.counts() == {"stream_stalled": 1}
    assert watch.cancel_slow() == []  # cancelled once


def test_a_trickled_upload_is_cancelled_once_behind_the_pace() -> None:
    clock = FakeClock()
    watch, stream, cancelled, refusals = watched(clock)
    for _ in range(4):  # 4 bytes every half second: moving, never idle
        clock.now += 0.5
        stream.moved(4)
        assert watch.cancel_slow() == []
    clock.now += 0.5
    stream.moved(4)
    assert watch.cancel_slow() == [stream] and stream.cancelled_for == "min_transfer_rate"
    assert cancelled == ["Pull"] and refusals.counts() == {"stream_stalled": 1}
