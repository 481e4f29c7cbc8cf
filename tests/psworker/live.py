"""A shard served over a real gRPC server on a free loopback port, for the worker's live tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from psserver.core.shard import Shard
from psserver.rpc.server import start_server


@contextmanager
def serving(shard: Shard, **options: Any) -> Iterator[str]:
    """``shard``'s address while it is served (``options``: ``start_server``'s, such as limits or
    interceptors); the server stops at once afterwards."""
    running = start_server(shard, "127.0.0.1:0", **options)
    try:
        yield f"127.0.0.1:{running.port}"
    finally:
        running.stop(0)
