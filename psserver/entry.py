"""The ``psserver`` command (``psserver serve`` applies its allocator settings as it starts)."""

from __future__ import annotations


def run() -> None:
    from psserver.cli import main

    main()
