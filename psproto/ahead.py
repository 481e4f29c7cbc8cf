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
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# Messages made ahead of the sender at most: 4 MiB of the default 1 MiB chunks.
DEPTH = 4
_END: Any = object()
_POLL_SECONDS = 0.05  # how often a builder waiting for room checks whether it was stopped


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Ahead(Generic[T]):
    """``items``, made on ``builder`` at most ``depth`` ahead of whoever iterates."""

    def __init__(self, items: Iterable[T], builder: Executor, depth: int = DEPTH) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self._made: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._ended = False
        self._work: Future[None] = builder.submit(self._build, iter(items))

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
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

    def close(self) -> None:
        """Stop the builder and wait until it has stopped; safe to call more than once."""
        self._stop.set()
        if self._work.cancel():
            self._ended = True  # still queued for a thread: it never started, so nothing ran
            return
        while not self._work.done():
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
