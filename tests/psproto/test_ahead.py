from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from psproto.ahead import Ahead, made_ahead


def test_items_come_in_order_and_the_builder_ends_with_them() -> None:
    with ThreadPoolExecutor(1) as builder:
        ahead = Ahead(iter(range(100)), builder, depth=3)
        assert list(ahead) == list(range(100))
        assert list(ahead) == []  # ended for good
        ahead.close()


def test_the_builder_runs_at_most_depth_items_ahead_of_the_sender() -> None:
    made: list[int] = []
    full = threading.Event()

    def items() -> Iterator[int]:
        for i in range(50):
            made.append(i)
            if len(made) == 4:  # 3 in the queue and the 4th waiting for room
                full.set()
            yield i

    with ThreadPoolExecutor(1) as builder:
        ahead = Ahead(items(), builder, depth=3)
        assert full.wait(10)
        time.sleep(0.2)  # time enough for a builder that ignored the bound to run on
        assert len(made) == 4
        assert next(ahead) == 0
        assert list(ahead) == list(range(1, 50))


def test_a_failure_while_making_reaches_the_sender_after_the_items_before_it() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise RuntimeError("the encoder failed")

    with ThreadPoolExecutor(1) as builder:
        ahead = Ahead(items(), builder)
        assert [next(ahead), next(ahead)] == [1, 2]
        with pytest.raises(RuntimeError, match="the encoder failed"):
            next(ahead)
        with pytest.raises(StopIteration):
            next(ahead)


def test_close_stops_the_builder_and_waits_for_it_before_returning() -> None:
    made: list[int] = []
    closed = threading.Event()

    def items() -> Iterator[int]:
        try:
            for i in range(1000):
                made.append(i)
                yield i
        finally:
            closed.set()

    with ThreadPoolExecutor(1) as builder:
        ahead = Ahead(items(), builder, depth=2)
        assert next(ahead) == 0
        ahead.close()
        assert closed.is_set()  # the stream was ended on the builder's thread before close returned
        count = len(made)
        time.sleep(0.1)
        assert len(made) == count < 1000
        with pytest.raises(StopIteration):
            next(ahead)
        ahead.close()


def test_a_depth_below_one_is_refused() -> None:
    with ThreadPoolExecutor(1) as builder, pytest.raises(ValueError, match="depth must be at least 1, got 0"):
        Ahead(iter(()), builder, depth=0)


def test_a_sender_waiting_for_an_item_ends_when_the_call_is_closed() -> None:
    def items() -> Iterator[str]:
        yield "header"
        time.sleep(0.5)  # a chunk still being encoded when the call fails
        yield "chunk"

    got: list[str] = []
    with ThreadPoolExecutor(1) as builder:
        ahead = Ahead(items(), builder)
        sender = threading.Thread(target=lambda: got.extend(ahead), daemon=True)  # gRPC's thread
        sender.start()
        time.sleep(0.1)  # it took the header and waits for the chunk
        ahead.close()  # the call ended: refused, cancelled or past its deadline
        sender.join(2)
        assert not sender.is_alive() and got == ["header"]


def test_closing_a_stream_still_waiting_for_a_builder_thread_returns_at_once_and_makes_nothing() -> None:
    made: list[int] = []

    def items() -> Iterator[int]:
        made.append(1)
        yield 1

    with ThreadPoolExecutor(1) as builder:
        busy = Ahead(iter(range(10**6)), builder, depth=2)  # a push whose server is not reading
        queued = Ahead(items(), builder)  # this push's builder waits for busy's thread
        started = time.monotonic()
        queued.close()
        assert time.monotonic() - started < 0.5
        busy.close()
    assert made == [] and list(queued) == []


def test_close_without_waiting_returns_while_the_builder_waits_for_its_next_item() -> None:
    release = threading.Event()
    asked = threading.Event()

    def items() -> Iterator[int]:
        yield 1
        asked.set()
        release.wait(10)  # a message not received yet
        yield 2

    with ThreadPoolExecutor(1) as builder:
        ahead = Ahead(items(), builder)
        assert next(ahead) == 1
        assert asked.wait(10)
        started = time.monotonic()
        ahead.close(wait=False)
        assert time.monotonic() - started < 1 and list(ahead) == []
        release.set()
        # The builder leaves once it has its item, putting nothing more.
        builder.submit(lambda: None).result(timeout=10)
        assert ahead._made.empty()


def test_the_first_items_are_taken_by_whoever_iterates_and_the_builder_starts_after_them() -> None:
    taken_on: list[str] = []

    def items() -> Iterator[int]:
        for i in range(6):
            taken_on.append(threading.current_thread().name)
            yield i

    with ThreadPoolExecutor(1, thread_name_prefix="builder") as builder:
        ahead = Ahead(items(), builder, start_after=2)
        assert [next(ahead), next(ahead)] == [0, 1]
        time.sleep(0.2)  # a builder started early would have made more by now
        assert taken_on == [threading.current_thread().name] * 2
        assert list(ahead) == [2, 3, 4, 5]
        assert all(name.startswith("builder") for name in taken_on[2:])
        ahead.close()


def test_a_stream_ending_or_failing_among_the_first_items_ends_it_without_a_builder() -> None:
    builder = ThreadPoolExecutor(1)
    assert list(Ahead(iter([7]), builder, start_after=3)) == [7]

    def failing() -> Iterator[int]:
        yield 1
        raise RuntimeError("the stream broke")

    ahead = Ahead(failing(), builder, start_after=3)
    assert next(ahead) == 1
    with pytest.raises(RuntimeError, match="the stream broke"):
        next(ahead)
    assert list(ahead) == []
    ahead.close()
    builder.shutdown()


def _noting_threads(count: int, threads: list[str], closed: threading.Event | None = None) -> Iterator[int]:
    """0 .. count-1, noting the name of the thread that made each; ``closed`` set when the stream ends."""
    try:
        for i in range(count):
            threads.append(threading.current_thread().name)
            yield i
    finally:
        if closed is not None:
            closed.set()


def test_made_ahead_without_ahead_hands_the_items_over_on_the_callers_thread() -> None:
    threads: list[str] = []
    with made_ahead(_noting_threads(3, threads), "test-made-ahead", False) as made:
        assert not isinstance(made, Ahead)
        assert list(made) == [0, 1, 2]
    assert set(threads) == {threading.current_thread().name}


def test_made_ahead_makes_on_the_uses_threads_and_stops_the_making_when_the_block_ends() -> None:
    threads: list[str] = []
    closed = threading.Event()
    items = _noting_threads(1000, threads, closed)
    with pytest.raises(RuntimeError, match="the call failed"), made_ahead(items, "test-made-ahead", True) as made:
        assert next(made) == 0
        raise RuntimeError("the call failed")
    assert closed.is_set()  # stopped and waited for, although the block ended with an error
    assert threads and all(name.startswith("test-made-ahead") for name in threads)
    count = len(threads)
    time.sleep(0.1)
    assert len(threads) == count < 1000


def test_made_ahead_takes_the_first_items_itself_when_asked() -> None:
    threads: list[str] = []
    with made_ahead(_noting_threads(3, threads), "test-made-ahead", True, start_after=1) as made:
        assert list(made) == [0, 1, 2]
    assert threads[0] == threading.current_thread().name
    assert all(name.startswith("test-made-ahead") for name in threads[1:])
