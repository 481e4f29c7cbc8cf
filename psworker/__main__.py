"""``python -m psworker``: the same as the ``psworker`` command.

That command is whatever the installed ``psworker`` console script names (``pstools.entry:run``:
``train`` from :mod:`pstasks.cli` plus the tools' commands), found through the distribution's
entry points, so this package never imports the tasks or the tools.
"""

import sys
from importlib.metadata import entry_points

_installed = entry_points(group="console_scripts", name="psworker")
if not _installed:
    sys.exit(
        "the psworker command comes with the installed hetps distribution (pip install hetps); "
        "from a source tree run python -m pstools"
    )
next(iter(_installed)).load()()
