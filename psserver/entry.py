"""The ``psserver`` command: tunes glibc's allocator before anything heavy is imported.

The settings must be in the environment when the process starts (psproto.tuning), so this
module imports nothing large before it may re-execute the process. ``psserver serve`` also
gets the arena cap of its ``--malloc-arenas`` (psserver.allocator), read from the command line
here, before the flags are parsed.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec

from psproto.tuning import apply_malloc_tuning
from psserver.allocator import arenas_override

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
    apply_malloc_tuning(arenas_override(sys.argv[1:]))
    from psserver.cli import main

    main()
