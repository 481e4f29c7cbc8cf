"""The ``psserver`` command (``psserver serve`` applies its allocator settings as it starts)."""

from __future__ import annotations

import sys
from importlib.util import find_spec

# What only the server imports; the base install (the client library) comes without them.
SERVER_MODULES = ("prometheus_client", "grpc_health", "grpc_reflection")


def require_server_extra() -> None:
    """Exit 2 naming the fix when the server's extra is not installed (a traceback says less)."""
    missing = [name for name in SERVER_MODULES if find_spec(name) is None]
    if missing:
        print(
            f"psserver needs the server extra ({', '.join(missing)} missing): pip install 'hetps[server]'",
            file=sys.stderr,
        )
        sys.exit(2)


def run() -> None:
    require_server_extra()
    from psserver.cli import main

    main()
