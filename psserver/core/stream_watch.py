"""Init uploads and pull replies watched for the limits pushes keep (psserver.core.receiving).

An Init stream decodes into a buffer of the shard's size, and a Pull (or PushPull) reply holds
a serialised parameter version; both hold one of the server's RPC threads (``threads`` in the configuration file) for
as long as they last. A client that trickles its Init or never reads its reply would hold
them for ever. So each such stream is watched from its start: one that moves no bytes for
``receive_idle_seconds`` or falls behind the transfer pace (psserver.core.pace) is cancelled
(the transport's ``cancel``; its client sees CANCELLED, and retries by that code) and counted
as STREAM_STALLED. A cancelled PushPull reply follows a push already applied: the retried push
is recognised by its push id and answered as a duplicate, so it is still applied once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from psserver.core.errors import ErrorKind
from psserver.core.pace import TransferPace
from psserver.core.refusals import Refusals
from psserver.core.workers import WorkerRecord

_LOGGER = logging.getLogger(__name__)


@dataclass(eq=False)  # identity: the watch tracks the streams in progress
class WatchedStream:
    """One Init upload or pull reply in progress; the transport reports the bytes it moved."""

    worker: WorkerRecord
    rpc: str
    cancel: Callable[[], object]
    watch: StreamWatch
    started: float
    last_moved_at: float
    bytes_moved: int = 0
    # Set (under the watch's lock) when the stream was cancelled: which limit it passed.
    cancelled_for: str | None = None
    _closed: bool = field(default=False, repr=False)

    def moved(self, nbytes: int) -> None:
        self.bytes_moved += nbytes
        self.last_moved_at = self.watch.now()

    def close(self) -> None:
        """The stream ended (however): no longer watched. Safe to call more than once."""
        self.watch.forget(self)


class StreamWatch:
    def __init__(self, refusals: Refusals, now: Callable[[], float], idle_s: float, pace: TransferPace) -> None:
        self.refusals = refusals
        self.now = now
        self._idle_s = idle_s
        self._pace = pace
        self._streams: set[WatchedStream] = set()
        self._lock = threading.Lock()

    def watch(self, worker: WorkerRecord, rpc: str, cancel: Callable[[], object]) -> WatchedStream:
        now = self.now()
        stream = WatchedStream(worker, rpc, cancel, self, now, now)
        with self._lock:
            self._streams.add(stream)
        return stream

    def forget(self, stream: WatchedStream) -> None:
        with self._lock:
            self._streams.discard(stream)

    def cancel_slow(self) -> list[WatchedStream]:
        """Cancel every stream idle too long or behind the pace; returns them."""
        now = self.now()
        with self._lock:
            slow: list[WatchedStream] = []
            for stream in self._streams:
                if now - stream.last_moved_at > self._idle_s:
                    stream.cancelled_for = "receive_idle_seconds"
                elif self._pace.behind(stream.bytes_moved, now - stream.started):
                    stream.cancelled_for = "min_transfer_rate"
                else:
                    continue
                slow.append(stream)
            self._streams.difference_update(slow)
        for stream in slow:
            _LOGGER.warning(
                "cancelled a %s stream of worker %s (%s): %d bytes in %.1f s, idle for %.1f s; slower than %s "
                "(shard.transfer_pace) or idle for over %g s (shard.receive_idle_seconds)",
                stream.rpc,
                stream.worker.worker_id,
                stream.worker.name,
                stream.bytes_moved,
                now - stream.started,
                now - stream.last_moved_at,
                self._pace.describe(),
                self._idle_s,
            )
            self.refusals.count(ErrorKind.STREAM_STALLED.reason, stream.worker)
            stream.cancel()
        return slow
