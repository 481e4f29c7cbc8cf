"""``python -m psworker``: psworker's own commands (the console script adds the tools', pstools.entry)."""

from __future__ import annotations

import signal


def prepare_process() -> None:
    """Make SIGINT raise KeyboardInterrupt."""
    # A process started in the background by a non-interactive shell (`cmd &` in a script, nohup
    # under some supervisors) inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt: `kill -INT` would not make the worker leave its shards and stop.
    signal.signal(signal.SIGINT, signal.default_int_handler)
