"""A pulled version's reply messages, serialised chunk by chunk as the transport sends them.

Serialising a whole ResNet-18-sized version (45 MB) before its first byte leaves adds the copy's
time to every step; building each message only when the transport asks for it overlaps the
copies with the sending. The bytes of each message come from a ``PullEncoder`` that the
transport injects (psserver.rpc): the core never knows the wire format.

Contract with the owner of the source: the source may be read here until ``complete``; whoever
changes it must call ``freeze`` first (``PullVersions.freeze_before_update`` does, under the
shard lock, before every update). ``freeze`` builds the messages not built yet, so every reader
still gets exactly the version it pulled. A private lock orders a reader's build of one message
against ``freeze``; it never waits on the shard lock.

A version read from a private source that nobody changes (``retain=False``: a snapshot the rule
keeps anyway) keeps no messages: each reader's message is built when it asks and belongs to it
alone, so such a version holds no more than its source (which the rule holds anyway) instead
of a second copy of the shard in reply bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Protocol

import torch

from psproto import codec


class PullEncoder(Protocol):
    """Serialises one reply message carrying one chunk of a pulled version."""

    def encode(self, clock: int, total_length: int, chunk: codec.ChunkPayload) -> bytes: ...


class SerializedPull:
    """The messages of one version, built on first read and shared by every reader."""

    def __init__(
        self,
        source: torch.Tensor,
        clock: int,
        wire_dtype: int,
        spans: Sequence[range],
        encoder: PullEncoder,
        retain: bool = True,
    ) -> None:
        self._source: torch.Tensor | None = source
        self._chunker: codec.Chunker | None = codec.Chunker(source, wire_dtype)
        self._retain = retain
        self._clock = clock
        self._total = source.numel()
        self._spans = tuple(spans)
        self._encoder = encoder
        self._lock = threading.Lock()
        self._messages: list[bytes | None] = [None] * len(self._spans)
        self._unbuilt = len(self._spans)

    def __len__(self) -> int:
        return len(self._spans)

    def __iter__(self) -> Iterator[bytes]:
        if not self._retain:
            yield from self._unretained()
            return
        for index in range(len(self._spans)):
            message = self._messages[index]
            if message is None:
                with self._lock:
                    message = self._message_locked(index)
            yield message

    def _unretained(self) -> Iterator[bytes]:
        chunker = self._chunker
        assert chunker is not None
        for span in self._spans:
            yield self._encoder.encode(self._clock, self._total, chunker.payload(span))

    @property
    def retained_bytes(self) -> int:
        """Bytes of the messages this version keeps (built and shared by its readers)."""
        return sum(len(message) for message in self._messages if message is not None)

    def reads(self, tensor: torch.Tensor) -> bool:
        """Whether messages not built yet will be read from ``tensor``."""
        return self._source is tensor

    @property
    def complete(self) -> bool:
        """Every message is built: the source is no longer read (never, without ``retain``)."""
        return self._retain and self._unbuilt == 0

    def freeze(self) -> None:
        """Build every message not built yet, so the source may change."""
        if not self._retain:
            raise RuntimeError("a version of a private source keeps reading it: it must not change")
        with self._lock:
            for index in range(len(self._spans)):
                self._message_locked(index)

    def _message_locked(self, index: int) -> bytes:
        message = self._messages[index]
        if message is None:
            assert self._chunker is not None
            message = self._encoder.encode(self._clock, self._total, self._chunker.payload(self._spans[index]))
            self._messages[index] = message
            self._unbuilt -= 1
            if self._unbuilt == 0:
                # The messages are the copy now: nothing here keeps the source alive.
                self._source = self._chunker = None
        return message
