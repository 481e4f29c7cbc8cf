"""The wire encoders the servicer hands to the shard's pulls: chunks of a version as reply bytes.

The core serialises each version once per clock and shares it between the workers pulling it,
but it never knows the wire format: it calls ``PullEncoder.encode`` (psserver.core.pull_versions)
for each chunk, and these build the messages with psproto.wire, without a protobuf object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from psproto import codec, wire

# (clock, total_length, offset, dtype, data) -> one serialised reply message
_MessageBuilder = Callable[[int, int, int, int, memoryview], bytes]


@dataclass(frozen=True, eq=False)  # identity: the shard caches versions per encoder
class WireEncoder:
    """A ``PullEncoder`` writing one kind of reply message."""

    name: str
    build: _MessageBuilder

    def encode(self, clock: int, total_length: int, chunk: codec.ChunkPayload) -> bytes:
        return self.build(clock, total_length, chunk.offset, chunk.dtype, chunk.data)


# Pull's reply stream: PullResponse messages.
PULL_RESPONSE = WireEncoder("PullResponse", wire.pull_response)
# PushPull's reply stream after the acknowledgement: PushPullResponse messages carrying parameters.
PUSH_PULL_PARAMS = WireEncoder("PushPullResponse.params", wire.push_pull_params)
