"""The ``psserver`` command: tunes glibc's allocator before anything heavy is imported.

The settings must be in the environment when the process starts (psproto.tuning), so this
module imports nothing large before it may re-execute the process.
"""

from __future__ import annotations

from psproto.tuning import apply_malloc_tuning


def run() -> None:
    apply_malloc_tuning()
    from psserver.cli import main

    main()
