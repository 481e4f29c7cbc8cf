"""The ``psworker`` console script: ``train`` (:mod:`pstasks.cli`) and the tools' commands (cluster, simulate, export).

It prepares the process (:func:`psworker.entry.prepare_process`: allocator tuning, SIGINT) before
anything heavy is imported, then runs :data:`pstools.cli.main`.
"""

from __future__ import annotations

from psworker.entry import prepare_process


def run() -> None:
    prepare_process()
    from pstools.cli import main

    main()
