"""A request stream made ahead of its sending, on a thread of its own.

gRPC's sending thread asks a request iterator for each message, hands it to the transport and
waits for it to be taken before it asks for the next. A message that takes work to make (a chunk
copied out of the tensor, an 8-bit chunk encoded with error feedback) is then made between two
sends, on the sending path. :class:`Ahead` makes the messages on a builder thread instead, at
most ``depth`` ahead of the sender, so the making overlaps the sending: the copies and torch's
operations release the GIL. The sender finds the next message made, or waits for it.

Whoever starts one must :meth:`~Ahead.close` it when the call ends, however it ends (a finished
stream closes itself): the builder is then stopped and waited for, so nothing it writes (an 8-bit
encoder's residual) is still being written when the call's caller goes on.

The same works the other way round, for a stream that comes in: with a call's incoming messages as
the items, the builder thread asks gRPC for the next message while the thread that iterates decodes
the one before (gRPC's receiving thread hands a call one message at a time, when it is asked for).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager
from functools import cache
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# Messages made ahead of the sender at most: 4 MiB of the default 1 MiB chunks.
DEPTH = 4
_END: Any = object()
_POLL_SECONDS = 0.05  # how often a builder waiting for room checks whether it was stopped
# Streams made ahead at once in a process, per use. A builder keeps its thread until its stream
# ends, at the pace of whoever iterates, so a stream beyond these would wait for another's end.
SHARED_THREADS = 64


@cache
def threads_for(use: str, count: int = SHARED_THREADS) -> ThreadPoolExecutor:
    """``count`` threads a process runs ``use``'s work on (their name), shared by every call of the
    process and started as needed. Not a client's own pool: its threads are busy in the calls."""
    return ThreadPoolExecutor(count, thread_name_prefix=use)


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Ahead(Generic[T]):
    """``items``, made on ``builder`` at most ``depth`` ahead of whoever iterates.

    ``start_after``: that many items are taken from ``items`` by whoever iterates, as they are asked
    for, and the builder starts when the next one is asked for (a push's first chunk takes its
    receive buffer: a push still waiting for one reads nothing ahead)."""

    def __init__(self, items: Iterable[T], builder: Executor, depth: int = DEPTH, start_after: int = 0) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self._made: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._ended = False
        self._items = iter(items)
        self._builder = builder
        self._direct = start_after
        self._work: Future[None] | None = None
        if not start_after:
            self._work = builder.submit(self._build, self._items)  # a head start on the first item

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._direct and not self._ended:
            self._direct -= 1
            try:
                return next(self._items)
            except BaseException:
                self._ended = True
                raise
        if self._work is None and not self._ended:
            self._work = self._builder.submit(self._build, self._items)
        while not self._ended:
            try:
                item = self._made.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                # Closed while waiting (the call ended: refused, cancelled, past its deadline): the
                # builder puts nothing more, and gRPC's thread must not wait here for ever.
                self._ended = self._stop.is_set()
                continue
            if item is _END:
                self._ended = True
            elif isinstance(item, _Failed):
                self._ended = True
                raise item.error
            else:
                return item  # type: ignore[no-any-return]
        raise StopIteration

    def close(self, wait: bool = True) -> None:
        """Stop the builder and wait until it has stopped; safe to call more than once.

        ``wait=False`` for items whose making touches nothing the caller goes on to use (messages read
        from a call): a builder waiting for its next item then leaves once it has it, or once the
        call ends, without holding up the caller."""
        self._stop.set()
        work = self._work
        if work is None or work.cancel():
            self._ended = True  # not started, or still queued for a thread: nothing ran
            return
        while wait and not work.done():
            with contextlib.suppress(queue.Empty):
                self._made.get(timeout=_POLL_SECONDS)  # room for a builder waiting to put one
        self._ended = True

    def _build(self, items: Iterator[T]) -> None:
        # How an item is made (torch's threads included: ``psworker.transfer.push_requests`` makes
        # each chunk inline) is the stream's business; this only moves the making to this thread.
        try:
            while not self._stop.is_set():
                item = next(items, _END)
                if not self._put(item) or item is _END:
                    break
        except BaseException as error:  # handed to the sender, which raises it in the call
            self._put(_Failed(error))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # a stream stopped half-way ends here, on the thread that ran it

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._made.put(item, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False


@contextmanager
def made_ahead(
    items: Iterable[T], use: str, ahead: bool, *, wait: bool = True, start_after: int = 0
) -> Iterator[Iterator[T]]:
    """``items`` as they are (``ahead`` False), or made ahead on the process's ``use`` threads
    (:func:`threads_for`); the making is stopped when the block ends, however it ends, and waited
    for unless ``wait`` is False (items read from a call that is ending: see :meth:`Ahead.close`)."""
    if not ahead:
        yield iter(items)
        return
    made = Ahead(items, threads_for(use), start_after=start_after)
    try:
        yield made
    finally:
        made.close(wait=wait)
