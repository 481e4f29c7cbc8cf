"""The ``psserver`` command: tunes glibc's allocator before anything heavy is imported.

The settings must be in the environment when the process starts (psproto.tuning), so this
module imports nothing large before it may re-execute the process. ``psserver serve`` also
gets the arena cap of its ``--malloc-arenas`` (psserver.allocator), read from the command line
here, before the flags are parsed.
"""

from __future__ import annotations

import sys

from psproto.tuning import apply_malloc_tuning
from psserver.allocator import arenas_override


def run() -> None:
    apply_malloc_tuning(arenas_override(sys.argv[1:]))
    from psserver.cli import main

    main()
