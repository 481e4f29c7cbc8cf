"""``python -m pstools``: the same as the ``psworker`` command (with the tools' commands)."""

from pstools.entry import run

run()
