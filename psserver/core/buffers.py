"""Receive buffers for pushes: reused across pushes, only so many in use at once, one per worker.

Every push is decoded into a flat fp32 buffer of the shard's length and checked whole before
the rule sees it. Allocating that buffer per push churns the allocator; letting every
concurrent push hold one makes the server's memory grow with the number of workers (16
workers pushing ResNet-18 at once would hold 16 × 47 MB). The pool keeps at most ``limit``
buffers in use; a push that finds none free waits for one before it reads its chunks, so
gRPC's flow control holds the rest of its bytes on the worker's side.

The pool is bounded by bytes too: past one buffer it holds at most ``MAX_POOL_BYTES``, so a
shard whose buffer is larger (ResNet-18 size and up) receives one push at a time. A second
buffer only overlaps one push's decode with the previous one's apply, which is short next to
it; for a 124M-parameter shard it was 496 MB more of peak RSS.

A worker (an ``owner``) holds at most one buffer at a time: its second concurrent push waits
for its first to finish, so one worker can never take every buffer from the others.
"""

from __future__ import annotations

import time
from collections import Counter

import torch

from psserver.core.waiting import Pause, Signal, Steps, run_blocking

# The most memory a pool of more than one buffer may hold (a pool holds at least one).
MAX_POOL_BYTES = 32 * 1024 * 1024


class BufferWaitTimeoutError(TimeoutError):
    """No buffer came free in time; ``own_share`` when the owner's own other buffer was what it waited for."""

    def __init__(self, message: str, own_share: bool) -> None:
        super().__init__(message)
        self.own_share = own_share


class ReceiveBuffers:
    """Flat fp32 buffers of one length; ``acquire`` blocks while ``limit`` are in use (at most ``limit``
    asked for, within ``MAX_POOL_BYTES`` past the first), or the owner holds one."""

    def __init__(self, length: int, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"at least one receive buffer is needed, not {limit}")
        self.length = length
        self.limit = max(1, min(limit, MAX_POOL_BYTES // max(1, 4 * length)))
        self._free: list[torch.Tensor] = []
        self._in_use = 0
        self._extra = 0
        self._owners: Counter[str] = Counter()
        # A push waiting for a buffer waits on it; a release wakes it.
        self.signal = Signal()
        self._lock = self.signal.lock

    @property
    def in_use(self) -> int:
        with self._lock:
            return self._in_use + self._extra

    @property
    def allocated(self) -> int:
        """Buffers this pool holds memory for (free or in use)."""
        with self._lock:
            return len(self._free) + self._in_use

    def held_by(self, owner: str) -> int:
        with self._lock:
            return self._owners[owner]

    def acquire(
        self, timeout_s: float | None = None, *, bypass_limit: bool = False, owner: str | None = None
    ) -> torch.Tensor:
        """``acquire_steps`` waited out on this thread."""
        return run_blocking(self.acquire_steps(timeout_s, bypass_limit=bypass_limit, owner=owner))

    def acquire_steps(
        self, timeout_s: float | None = None, *, bypass_limit: bool = False, owner: str | None = None
    ) -> Steps[torch.Tensor]:
        """A buffer of ``length`` elements (contents undefined), counted against ``owner``'s share.

        ``bypass_limit`` gives one at once even when all are in use (a temporary buffer, not
        kept): for a push others are waiting on, which must not queue behind them. It never
        bypasses the owner's share, so a bypassing owner holds at most one extra buffer.
        Raises ``BufferWaitTimeoutError`` when none came free within ``timeout_s``.
        """
        with self._lock:

            def own_share_free() -> bool:
                return owner is None or self._owners[owner] == 0

            def free() -> bool:
                return own_share_free() and (bypass_limit or self._in_use < self.limit)

            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while not free():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is None or remaining > 0:
                    yield Pause(self.signal, remaining, free)
                    continue
                own = not own_share_free()
                held = f"worker {owner} already holds one" if own else f"{self.limit} in use"
                raise BufferWaitTimeoutError(f"no receive buffer came free in {timeout_s} s ({held})", own)
            if owner is not None:
                self._owners[owner] += 1
            if self._in_use >= self.limit:
                self._extra += 1
                return torch.empty(self.length)
            self._in_use += 1
            return self._free.pop() if self._free else torch.empty(self.length)

    def release(self, buffer: torch.Tensor, owner: str | None = None) -> None:
        with self._lock:
            if buffer.numel() != self.length:
                raise ValueError(f"a buffer of {buffer.numel()} elements is not this pool's ({self.length})")
            if owner is not None and self._owners[owner] > 0:
                self._owners[owner] -= 1
                if not self._owners[owner]:
                    del self._owners[owner]
            # A buffer or a share came free: wake every waiter to re-check.
            self.signal.notify_all()
            if self._extra and self._in_use + self._extra > self.limit:
                # Temporary buffers are dropped first so the pool never keeps more than ``limit``.
                self._extra -= 1
                return
            self._in_use -= 1
            self._free.append(buffer)
