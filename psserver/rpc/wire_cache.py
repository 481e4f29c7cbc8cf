"""Pull replies serialised once per clock and wire dtype, shared by every worker pulling them.

Pull and PushPull are registered with an identity response serializer, so these bytes go to
gRPC as they are: no message is built or serialised per worker.
"""

from __future__ import annotations

import threading

from psproto import wire
from psproto.v1 import ps_pb2
from psserver.core.shard import PullResult

# Serialised forms of the latest clock only; a pull of an older clock is served from the
# shard's payloads and cached until the clock moves on.
_KINDS = ("pull", "push_pull")


class SerializedPulls:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, int, int], list[bytes]] = {}

    def get(self, kind: str, result: PullResult) -> list[bytes]:
        """Serialised PullResponse (``pull``) or PushPullResponse (``push_pull``) messages."""
        dtype = result.chunks[0].dtype if result.chunks else ps_pb2.DTYPE_FLOAT32
        key = (kind, result.clock, int(dtype))
        with self._lock:
            cached = self._entries.get(key)
        if cached is not None:
            return cached
        # One copy per message, from the shard's parameter copy straight into the reply bytes.
        build = wire.pull_response if kind == "pull" else wire.push_pull_params
        serialized = [build(result.clock, result.total_length, p.offset, p.dtype, p.data) for p in result.chunks]
        with self._lock:
            newest = max((k[1] for k in self._entries), default=-1)
            if result.clock >= newest:
                self._entries = {k: v for k, v in self._entries.items() if k[1] == result.clock}
                self._entries[key] = serialized
        return serialized
