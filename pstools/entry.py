"""The ``psworker`` console script: psworker's commands and the tools' (cluster, simulate, export).

It applies a worker's allocator settings (psserver.allocator, before anything heavy is imported)
and prepares SIGINT as :mod:`psworker.entry` does, then runs :data:`pstools.cli.main`.
"""

from __future__ import annotations

from psserver.allocator import WORKER, apply_allocator
from psworker.entry import prepare_process


def run() -> None:
    apply_allocator(WORKER)
    prepare_process()
    from pstools.cli import main

    main()
