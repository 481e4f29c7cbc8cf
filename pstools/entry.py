"""The ``psworker`` console script: psworker's commands and the tools' (cluster, simulate, export).

It prepares the process as :mod:`psworker.entry` does (allocator tuning, SIGINT) before
anything heavy is imported, then runs :data:`pstools.cli.main`.
"""

from __future__ import annotations

from psworker.entry import prepare_process


def run() -> None:
    prepare_process()
    from pstools.cli import main

    main()
