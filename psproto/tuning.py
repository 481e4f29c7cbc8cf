"""Process settings the hetps entry points apply before any large buffer is allocated.

glibc returns big buffers to the OS and faults them in again on every allocation; moving
tens of MB per message through gRPC then costs 3-4x more. The thresholds below keep such
buffers in the heap. Because kept buffers stay in the arena of the thread that freed them,
the arenas are limited to two: a server whose 16 handler threads each kept their own peaked at
1.4 GB with 16 ResNet-18-sized workers, and at 0.95 GB with two arenas, steps as fast. One
arena held 12% less again but moved 3-6% fewer steps for 16 workers together
(``benchmarks.receive_window --windows 4MiB,4MiB+MALLOC_ARENA_MAX=1`` compares them side by
side); a variable already in the environment is left as it is, except where an entry point
asks for its own value (``overrides``: ``psserver serve`` runs on one arena, ``--malloc-arenas``).
They are read once, at process start, so the entry points re-execute themselves with them set.
Set ``HETPS_MALLOC_TUNING=0`` (or ``false``, ``no``, ``off``) to turn this off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

MALLOC_SETTINGS = {
    "MALLOC_MMAP_THRESHOLD_": str(4 * 1024**3),
    "MALLOC_TRIM_THRESHOLD_": str(16 * 1024**3),
    "MALLOC_TOP_PAD_": str(256 * 1024**2),
    "MALLOC_ARENA_MAX": "2",
}
DISABLE_VARIABLE = "HETPS_MALLOC_TUNING"
OFF_VALUES = frozenset({"0", "false", "no", "off"})


def wanted_environment(environ: Mapping[str, str], overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings missing from ``environ``, and the ``overrides`` it holds another value of
    (empty when tuning is off or already applied)."""
    if environ.get(DISABLE_VARIABLE, "1").strip().lower() in OFF_VALUES:
        return {}
    wanted = {key: value for key, value in MALLOC_SETTINGS.items() if key not in environ}
    wanted.update({key: value for key, value in (overrides or {}).items() if environ.get(key) != value})
    return wanted


def apply_malloc_tuning(overrides: Mapping[str, str] | None = None) -> None:
    """Re-execute this process with the glibc settings (and ``overrides``, which replace a value
    already in the environment) unless they are set or turned off."""
    missing = wanted_environment(dict(os.environ), overrides)
    if not missing or not sys.platform.startswith("linux"):
        return
    os.environ.update(missing)
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
