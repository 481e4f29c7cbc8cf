"""The server process's glibc allocator: shard-sized buffers mapped, and given back when freed.

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
import ctypes.util
import logging
import sys

_LOGGER = logging.getLogger(__name__)

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
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
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
