"""A pulled version's reply messages, serialised chunk by chunk as the transport sends them.

Serialising a whole ResNet-18-sized version (45 MB) before its first byte leaves adds the copy's
time to every step; building each message only when the transport asks for it overlaps the
copies with the sending. When the source is the shard's live parameters, the shard calls
``freeze`` (holding the lock this object was given) before it changes them: the messages not
built yet are built then, so every reader still gets exactly the version it pulled.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence

import torch

from psproto import codec

# (clock, total_length, offset, dtype, data) -> one serialised reply message
MessageBuilder = Callable[[int, int, int, int, memoryview], bytes]


class SerializedPull:
    """The messages of one version, built on first read and shared by every reader.

    ``lock`` guards the source: the shard's own lock when the source is its live parameters
    (which ``freeze`` runs under), a private lock for a copy nobody changes.
    """

    def __init__(
        self,
        source: torch.Tensor,
        clock: int,
        wire_dtype: int,
        spans: Sequence[range],
        build: MessageBuilder,
        lock: threading.Lock,
    ) -> None:
        self._source: torch.Tensor | None = source
        self._clock = clock
        self._total = source.numel()
        self._wire_dtype = wire_dtype
        self._spans = tuple(spans)
        self._build = build
        self._lock = lock
        self._messages: list[bytes | None] = [None] * len(self._spans)
        self._unbuilt = len(self._spans)

    def __len__(self) -> int:
        return len(self._spans)

    def __iter__(self) -> Iterator[bytes]:
        for index in range(len(self._spans)):
            message = self._messages[index]
            if message is None:
                with self._lock:
                    message = self._message_locked(index)
            yield message

    def reads(self, tensor: torch.Tensor) -> bool:
        """Whether messages not built yet will be read from ``tensor``."""
        return self._source is tensor

    @property
    def complete(self) -> bool:
        """Every message is built: the source is no longer read."""
        return self._unbuilt == 0

    def freeze(self) -> None:
        """Build every message not built yet, so the source may change (caller holds the lock)."""
        for index in range(len(self._spans)):
            self._message_locked(index)

    def _message_locked(self, index: int) -> bytes:
        message = self._messages[index]
        if message is None:
            assert self._source is not None
            chunk = codec.payload(self._source, self._spans[index], self._wire_dtype)
            message = self._build(self._clock, self._total, chunk.offset, chunk.dtype, chunk.data)
            self._messages[index] = message
            self._unbuilt -= 1
            if self._unbuilt == 0:
                self._source = None  # the messages are the copy now
        return message
