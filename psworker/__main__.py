"""``python -m psworker``: the same as the ``psworker`` command."""

from psworker.entry import run

run()
