"""``python -m psserver``: the same as the ``psserver`` command."""

from psserver.entry import run

run()
