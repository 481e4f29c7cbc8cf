"""The server process's glibc allocator: one arena, and shard-sized buffers mapped and given back
when freed.

One arena. The entry points cap glibc at two arenas (psproto.tuning); ``psserver serve`` runs on
one (``--malloc-arenas``, default 1), which the entry point sets as ``MALLOC_ARENA_MAX`` before it
re-executes the process (``arenas_override``), replacing a value inherited from a tuned parent:
glibc reads it once, at start. With two, memory freed in one arena (a version's reply bytes, a
push's chunks, gRPC's receive slices) does not serve a request from a thread of the other, so each
arena keeps its own high-water mark resident: with 16 concurrent ResNet-18-sized workers the ASGD
server peaked about 100 MB lower on one arena, and one worker stepped as fast
(``benchmarks.server_memory --quick``, docs/performance.md has the runs).

Mapped buffers.
The entry points' settings (psproto.tuning) keep every freed buffer in the heap, however
large, because faulting tens of MB in again per gRPC message made transfers 3-4x slower.
A server also allocates buffers of the shard's size (gap-aware's snapshots, a version's
private copy, an Init upload) that come and go with its workers; kept in the heap they
leave holes the next message does not fill, and the process keeps them resident. Above a
threshold the server maps each such buffer on its own (glibc ``M_MMAP_THRESHOLD``), so it
goes back to the system when freed; messages, far smaller, stay in the heap as before. The
heap's free top is then given back past twice the threshold (``M_TRIM_THRESHOLD``), with no
extra padding when it grows (``M_TOP_PAD``). The entry point's start-up padding has by then
left hundreds of MB free at the heap's top, from which a shard-sized buffer would still be cut
(and kept), so the settings end by trimming the heap once (``malloc_trim``).
``psserver serve --malloc-mmap-mib`` sets the threshold (default 32); 0 leaves the process's
settings alone. Measured (before the trim was added) with ``benchmarks.server_memory --quick``:
gap-aware under 4 workers peaked at 866-888 MB in five runs with it and at 877 and 1,037 MB in
two without it (before a version of a snapshot kept no reply bytes, it had lowered that peak
from 1,218 to 1,021 MB).
"""

from __future__ import annotations

import ctypes
import logging
import sys
from collections.abc import Mapping, Sequence

_LOGGER = logging.getLogger(__name__)

ARENAS_VARIABLE = "MALLOC_ARENA_MAX"
DEFAULT_ARENAS = 1
MAX_ARENAS = 64
_ARENAS_FLAG = "--malloc-arenas"

# mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
# glibc refuses a mapping threshold above half its largest heap (32 MiB on 64-bit systems).
MAX_MMAP_MIB = 32
DEFAULT_MMAP_MIB = 32
_MIB = 1024 * 1024


def map_large_buffers(threshold_mib: int) -> bool:
    """Map (and give back when freed) every allocation of at least ``threshold_mib`` MiB; whether
    the allocator took the settings (False off glibc, or for 0, which changes nothing)."""
    if not 0 <= threshold_mib <= MAX_MMAP_MIB:
        raise ValueError(f"the mapping threshold is 0 to {MAX_MMAP_MIB} MiB, not {threshold_mib}")
    if threshold_mib == 0 or not sys.platform.startswith("linux"):
        return False
    try:
        # The process's own symbols hold libc's (find_library would start ldconfig to look it up).
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    threshold = threshold_mib * _MIB
    settings = ((_M_MMAP_THRESHOLD, threshold), (_M_TRIM_THRESHOLD, 2 * threshold), (_M_TOP_PAD, 0))
    applied = all(mallopt(parameter, value) == 1 for parameter, value in settings)
    if applied:
        libc.malloc_trim.argtypes = (ctypes.c_size_t,)
        libc.malloc_trim(0)
    else:
        _LOGGER.warning("the allocator refused a setting of --malloc-mmap-mib %d; its defaults stay", threshold_mib)
    return applied


def requested_arenas(argv: Sequence[str]) -> int | None:
    """The arenas a ``psserver serve`` command line asks for (``--malloc-arenas``, else the default);
    None for another command, or for a value the flag's parser will refuse (it then says why)."""
    if "serve" not in argv:
        return None
    value: str | None = None
    for index, argument in enumerate(argv):
        if argument == _ARENAS_FLAG and index + 1 < len(argv):
            value = argv[index + 1]
        elif argument.startswith(_ARENAS_FLAG + "="):
            value = argument.partition("=")[2]
    if value is None:
        return DEFAULT_ARENAS
    try:
        arenas = int(value)
    except ValueError:
        return None
    return arenas if 1 <= arenas <= MAX_ARENAS else None


def default_server_environment() -> dict[str, str]:
    """The allocator variables a ``psserver serve`` with default flags replaces at start (one arena):
    what a baseline server in a benchmark passes to ``apply_malloc_tuning`` to run as hetps does."""
    return {ARENAS_VARIABLE: str(DEFAULT_ARENAS)}


def arenas_override(argv: Sequence[str]) -> dict[str, str]:
    """What the entry point sets before it re-executes ``psserver serve``: the arenas asked for,
    replacing a ``MALLOC_ARENA_MAX`` inherited from the parent (a tuned parent passes down 2)."""
    arenas = requested_arenas(argv)
    return {} if arenas is None else {ARENAS_VARIABLE: str(arenas)}


def arenas_in_effect(environ: Mapping[str, str]) -> int | None:
    """The arena cap this process started with (None: glibc's own, 8 per core)."""
    try:
        return int(environ[ARENAS_VARIABLE])
    except (KeyError, ValueError):
        return None
