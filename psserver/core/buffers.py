"""Receive buffers for pushes: reused across pushes, and only so many in use at once.

Every push is decoded into a flat fp32 buffer of the shard's length and checked whole before
the rule sees it. Allocating that buffer per push churns the allocator; letting every
concurrent push hold one makes the server's memory grow with the number of workers (16
workers pushing ResNet-18 at once would hold 16 × 47 MB). The pool keeps at most ``limit``
buffers in use; a push that finds none free waits for one before it reads its chunks, so
gRPC's flow control holds the rest of its bytes on the worker's side.
"""

from __future__ import annotations

import threading

import torch


class ReceiveBuffers:
    """Flat fp32 buffers of one length; ``acquire`` blocks while ``limit`` are in use."""

    def __init__(self, length: int, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"at least one receive buffer is needed, not {limit}")
        self.length = length
        self.limit = limit
        self._free: list[torch.Tensor] = []
        self._in_use = 0
        self._extra = 0
        self._changed = threading.Condition()

    @property
    def in_use(self) -> int:
        with self._changed:
            return self._in_use + self._extra

    @property
    def allocated(self) -> int:
        """Buffers this pool holds memory for (free or in use)."""
        with self._changed:
            return len(self._free) + self._in_use

    def acquire(self, timeout_s: float | None = None, *, bypass_limit: bool = False) -> torch.Tensor:
        """A buffer of ``length`` elements (contents undefined).

        ``bypass_limit`` gives one at once even when all are in use (a temporary buffer, not
        kept): for a push others are waiting on, which must not queue behind them.
        Raises ``TimeoutError`` when none came free within ``timeout_s``.
        """
        with self._changed:
            if bypass_limit and self._in_use >= self.limit:
                self._extra += 1
                return torch.empty(self.length)
            if not self._changed.wait_for(lambda: self._in_use < self.limit, timeout_s):
                raise TimeoutError(f"no receive buffer came free in {timeout_s} s ({self.limit} in use)")
            self._in_use += 1
            return self._free.pop() if self._free else torch.empty(self.length)

    def release(self, buffer: torch.Tensor) -> None:
        with self._changed:
            if buffer.numel() != self.length:
                raise ValueError(f"a buffer of {buffer.numel()} elements is not this pool's ({self.length})")
            if self._extra and self._in_use + self._extra > self.limit:
                # Temporary buffers are dropped first so the pool never keeps more than ``limit``.
                self._extra -= 1
                return
            self._in_use -= 1
            self._free.append(buffer)
            self._changed.notify()
