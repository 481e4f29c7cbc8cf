"""A pulled version's reply messages, serialised chunk by chunk as each reader's transport asks.

Serialising a whole ResNet-18-sized version (45 MB) before its first byte leaves adds the copy's
time to every step; building each message only when the transport asks for it overlaps the
copies with the sending. The bytes of each message come from a ``PullEncoder`` that the
transport injects (psserver.rpc): the core never knows the wire format.

A version keeps none of the messages it built: each belongs to the reader that asked for it and
is gone once sent. Keeping them to share between readers made every version a second copy of
the shard in reply bytes for as long as a reply or the cache held it (a 124M-parameter shard
peaked at 4.3x its parameters); building a message is one pass over its chunk, which its
reader pays for whoever built it first.

A version of the live parameters (``live``) reads them until ``freeze``: whoever changes them
calls it first (``PullVersions.freeze_before_update`` does, under the shard lock, before every
update). ``freeze`` copies the parameters once, in the wire dtype, for the readers still to
come, so every reader gets exactly the version it pulled. A private lock orders a reader's
build of one message from the live parameters against ``freeze``; it never waits on the shard
lock. A version of a private source that nobody changes (a snapshot the rule keeps anyway) is
never frozen, and holds nothing but that source.
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
    """The messages of one version, each built for its reader when read."""

    def __init__(
        self,
        source: torch.Tensor,
        clock: int,
        wire_dtype: int,
        spans: Sequence[range],
        encoder: PullEncoder,
        live: bool = False,
    ) -> None:
        self._source = source
        self._wire_dtype = wire_dtype
        self._chunker = codec.Chunker(source, wire_dtype)
        self._live = live
        self._clock = clock
        self._total = source.numel()
        self._spans = tuple(spans)
        self._encoder = encoder
        self._lock = threading.Lock()
        # Bytes of the private copy ``freeze`` made (0 while live, and for a private source).
        self.frozen_bytes = 0
        # Pulls handed this version whose reader has not read it to the end: a version whose
        # readers are all done reads nothing any more, however long its reply lingers.
        self._unread = 0

    def __len__(self) -> int:
        return len(self._spans)

    def hand_out(self) -> None:
        """A pull was given this version: its reader will read it (``__iter__``)."""
        with self._lock:
            self._unread += 1

    def __iter__(self) -> Iterator[bytes]:
        try:
            for span in self._spans:
                yield self._message(span)
        finally:
            with self._lock:
                self._unread = max(0, self._unread - 1)

    def _message(self, span: range) -> bytes:
        with self._lock:
            if self._live:
                # Built under the lock: ``freeze`` (and the update after it) waits for it.
                return self._encoder.encode(self._clock, self._total, self._chunker.payload(span))
            chunker = self._chunker
        return self._encoder.encode(self._clock, self._total, chunker.payload(span))

    def reads(self, tensor: torch.Tensor) -> bool:
        """Whether messages still to be built will be read from ``tensor`` as it is then (a reader
        handed this version has not read it to the end)."""
        return self._live and self._source is tensor and self._unread > 0

    @property
    def frozen_size(self) -> int:
        """Bytes ``freeze`` copies (the version in its wire dtype)."""
        return self._total * codec.element_size(self._wire_dtype)

    def freeze(self) -> None:
        """Copy the live source (once, in the wire dtype) so it may change; readers go on from the copy."""
        with self._lock:
            if not self._live:
                return
            self._source = self._source.to(codec.wire_dtype(self._wire_dtype), copy=True)
            self._chunker = codec.Chunker(self._source, self._wire_dtype)
            self._live = False
            self.frozen_bytes = self._source.numel() * self._source.element_size()
