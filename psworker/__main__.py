"""``python -m psworker``: the same as the ``psworker`` command.

That command is whatever the installed ``psworker`` console script names (``pstools.entry:run``,
psworker's commands plus the tools'); found through the distribution's entry points, so this
package never imports the tools. Without an installed distribution: psworker's own commands.
"""

from importlib.metadata import entry_points

from psworker.entry import run

_installed = entry_points(group="console_scripts", name="psworker")
(next(iter(_installed)).load() if _installed else run)()
