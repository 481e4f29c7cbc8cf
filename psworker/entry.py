"""The ``psworker`` command: tunes glibc's allocator before anything heavy is imported.

The settings must be in the environment when the process starts (psproto.tuning), so this
module imports nothing large before it may re-execute the process.
"""

from __future__ import annotations

import signal

from psproto.tuning import apply_malloc_tuning


def prepare_process() -> None:
    """Tune the allocator (may re-execute the process) and make SIGINT raise KeyboardInterrupt."""
    apply_malloc_tuning()
    # A process started in the background by a non-interactive shell (`cmd &` in a script, nohup
    # under some supervisors) inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt: `kill -INT` would not make the worker leave its shards and stop.
    signal.signal(signal.SIGINT, signal.default_int_handler)
