"""A shard served over a real gRPC server on a free loopback port, for the worker's live tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from psserver.core.shard import Shard
from psserver.rpc.server import start_server


@contextmanager
def serving(shard: Shard) -> Iterator[str]:
    """``shard``'s address while it is served; the server stops at once afterwards."""
    running = start_server(shard, "127.0.0.1:0")
    try:
        yield f"127.0.0.1:{running.port}"
    finally:
        running.server.stop(0).wait()
