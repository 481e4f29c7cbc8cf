"""How long a call to a shard may take before the client gives it up and tries again.

Every RPC the client makes carries a deadline, so no call waits forever on a link or a server
that stopped answering. The deadline is what an honest call needs, generously:

- a fixed allowance (``base_seconds``): a round trip, queueing behind other calls, an update
  applied. Join, Heartbeat, Status and Leave get this alone;
- the payload at a floor rate (``min_bytes_per_second``): the bytes the call sends and receives
  (a shard's slice in its wire dtype for Init, Pull, Push, PushPull); a 45 MiB push at the
  default 1 MiB/s gets 45 s more;
- for the calls the server may hold back (Pull under SSP or behind an exclusive pull, Push at a
  BSP barrier or behind an exclusive pull), the shard's lease from its Join reply. The server waits
  only on live workers: one that stops answering is evicted when its lease runs out, so no wait
  caused by a dead worker outlasts the lease. A wait on a live but slower worker may; the call
  then runs out, and is sent again (a pull is idempotent, a push keeps its push id and joins
  the round it is already in, or is answered from the server's record).

A silent link is not what deadlines are for: the keepalive (``psworker.channels``) notices it
in seconds whatever the deadline. Deadlines bound a call on a connection that answers pings
but never the call. Pure values, tested without a server.
"""

from __future__ import annotations

from dataclasses import dataclass

from psproto import codec


@dataclass(frozen=True)
class DeadlinePolicy:
    """The deadline of a call from its payload and the wait the server may impose."""

    # What a call with no payload needs: a round trip, queueing, an update applied.
    base_seconds: float = 10.0
    # The slowest transfer taken as still working; payloads get their size at this rate.
    min_bytes_per_second: float = float(2**20)

    def __post_init__(self) -> None:
        if not (self.base_seconds > 0 and self.min_bytes_per_second > 0):
            raise ValueError(
                f"a deadline needs a positive allowance and rate, not {self.base_seconds} s and "
                f"{self.min_bytes_per_second} bytes/s"
            )

    def short(self) -> float:
        """A call without payload that the server answers at once (Join, Heartbeat, Status, Leave)."""
        return self.base_seconds

    def transfer(self, payload_bytes: int, wait_seconds: float = 0.0) -> float:
        """A call moving ``payload_bytes`` (both directions together) that the server may hold back
        for ``wait_seconds``."""
        return self.base_seconds + max(0, payload_bytes) / self.min_bytes_per_second + max(0.0, wait_seconds)

    def held(self, length: int, lease_seconds: float, *wire_dtypes: int) -> float:
        """A call the shard may hold back (SSP, a BSP barrier, an exclusive pull), moving a shard's
        ``length`` elements once per dtype: its payload plus the shard's lease, the longest a dead
        worker holds anyone."""
        sent = sum(payload_bytes(length, dtype) for dtype in wire_dtypes)
        return self.transfer(sent, wait_seconds=lease_seconds)


def payload_bytes(length: int, wire_dtype: int) -> int:
    """The bytes of ``length`` elements in ``wire_dtype`` (0: fp32; int8 with its block scales) on the
    wire, chunk framing aside."""
    return codec.wire_bytes(length, wire_dtype)
