"""Process settings the hetps entry points apply before any large buffer is allocated.

glibc returns big buffers to the OS and faults them in again on every allocation; moving
tens of MB per message through gRPC then costs 3-4x more. The thresholds below keep such
buffers in the heap. Because kept buffers stay in the arena of the thread that freed them,
all threads share one arena. A server whose 16 handler threads each kept their own peaked at
1.4 GB with 16 ResNet-18-sized workers; in back-to-back probes of 16 such workers one arena
peaked at 0.89 and 1.02 GB where two arenas peaked at 1.18 and 1.15 GB, with steps per second
within the machine's run-to-run spread. Serving one worker, the server with one arena took a
few hundred page faults per step, with two 2,000 to 58,000: a buffer freed by one thread is
reused by the next instead of a second arena's heap being given back and faulted in again.
Large allocations are a few per message, so the one arena's lock is not contended.

The settings are read once, at process start, so the entry points re-execute themselves with
them set. Set ``HETPS_MALLOC_TUNING=0`` to turn this off.
"""

from __future__ import annotations

import os
import sys

MALLOC_SETTINGS = {
    "MALLOC_MMAP_THRESHOLD_": str(4 * 1024**3),
    "MALLOC_TRIM_THRESHOLD_": str(16 * 1024**3),
    "MALLOC_TOP_PAD_": str(256 * 1024**2),
    "MALLOC_ARENA_MAX": "1",
}
DISABLE_VARIABLE = "HETPS_MALLOC_TUNING"


def wanted_environment(environ: dict[str, str]) -> dict[str, str]:
    """The settings missing from ``environ`` (empty when tuning is off or already applied)."""
    if environ.get(DISABLE_VARIABLE, "1") == "0":
        return {}
    return {key: value for key, value in MALLOC_SETTINGS.items() if key not in environ}


def apply_malloc_tuning() -> None:
    """Re-execute this process with the glibc settings unless they are set or turned off."""
    missing = wanted_environment(dict(os.environ))
    if not missing or not sys.platform.startswith("linux"):
        return
    os.environ.update(missing)
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
