"""The ``psworker`` console script: ``train`` (:mod:`pstasks.cli`) and the tools' commands (cluster, simulate, export).

It applies a worker's allocator settings (psserver.allocator, before anything heavy is imported)
and prepares SIGINT (:func:`psworker.entry.prepare_process`), then runs :data:`pstools.cli.main`.
"""

from __future__ import annotations

from psserver.allocator import WORKER, apply_allocator
from psworker.entry import prepare_process


def run() -> None:
    apply_allocator(WORKER)
    prepare_process()
    from pstools.cli import main

    main()
