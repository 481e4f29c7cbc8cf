"""The pace a stream holding the shard's shared resources must keep, as a pure decision.

A push holds a receive buffer of the shard's size (and a server thread) from its first chunk
to its last. An honest client sends its bytes at its link's speed; a hostile or broken one can
send a byte at a time, each just inside the idle limit, and hold the buffer for ever. So each
byte gets a deadline: a stream that started ``t`` seconds ago must have moved at least
``min_bytes_per_s * (t - grace_s)`` bytes. A push of ``n`` bytes therefore holds its buffer at
most ``grace_s + n / min_bytes_per_s`` seconds (its whole deadline), and a trickle is caught
as soon as the grace has passed, whatever the push's size.

The rule counts wire bytes, so it does not depend on the dtype a worker sends in: a bf16
push has half the bytes of an fp32 one and needs half the time at the same link speed.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class TransferPace:
    """``min_bytes_per_s`` on average after ``grace_s`` seconds for the first bytes."""

    # Bytes a second a push, an Init upload or a pull reply must average after the grace.
    min_bytes_per_s: float = 0.1 * MIB
    # Seconds for a stream's first bytes before the rate applies.
    grace_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.min_bytes_per_s > 0 or not self.grace_s >= 0:
            raise ValueError(f"a transfer pace needs a positive rate and a grace of at least 0 s: {self}")

    def deadline_s(self, size_bytes: int) -> float:
        """Seconds a stream of ``size_bytes`` may take in all."""
        return self.grace_s + size_bytes / self.min_bytes_per_s

    def behind(self, bytes_moved: int, elapsed_s: float) -> bool:
        """True when ``bytes_moved`` after ``elapsed_s`` seconds is below the pace: the stream
        would miss the deadline of the bytes it has moved so far."""
        return bytes_moved < self.min_bytes_per_s * (elapsed_s - self.grace_s)

    def describe(self) -> str:
        return f"{self.min_bytes_per_s / MIB:g} MiB/s after a grace of {self.grace_s:g} s"
