"""The one glibc allocator policy of hetps's processes, applied at start-up with ``mallopt``.

Moving tens of MB per step through gRPC allocates and frees the same sizes over and over. glibc
left alone maps each large buffer on its own and unmaps it when freed, so every message faults
its pages in again (3-4x slower transfers when measured), and each thread's arena keeps its own
free memory. The policy:

- **Messages stay in the heap.** Below ``mmap_threshold_bytes`` an allocation comes from the
  heap and its memory serves the next one; every gRPC message and chunk is far smaller than the
  server's 32 MiB.
- **A server gives shard-sized buffers back.** At and above the threshold (a shard's snapshots, a
  version's private copy, an Init upload) a buffer is mapped on its own and returned to the
  system when freed, so those that come and go with workers leave no holes the process keeps
  resident; the heap's free top goes back past ``trim_threshold_bytes`` (twice the threshold),
  with no padding when it grows (``top_pad_bytes``).
- **A worker keeps what it freed** (``WORKER``): its buffers are the same sizes step after step,
  so nothing is mapped or trimmed, and the heap grows 256 MiB at a time.
- **Few arenas.** Memory freed in one arena does not serve a thread of another, so each keeps its
  own high-water mark. A server runs on one (with 16 concurrent ResNet-18-sized workers its peak
  was about 100 MB lower than on two, and one worker stepped as fast:
  ``benchmarks.server_memory --quick``); a worker, whose client fans out to the shards on
  threads of its own, on two.

``mallopt`` changes the running process (nothing re-executes it). It takes a C ``int``, so a
value is at most 2 GiB - 1, and a glibc may refuse a setting (older ones refuse a mapping
threshold above half their largest heap, 32 MiB): each refusal is logged and left out of what
``apply_allocator`` returns, which the server logs at start-up. ``psserver serve`` applies the
``[allocator]`` table of its configuration; the ``psworker`` entry point applies ``WORKER``.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from dataclasses import dataclass

_LOGGER = logging.getLogger(__name__)

# mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MIB = 1024 * 1024
# mallopt's values are C ints.
MAX_VALUE = 2**31 - 1


@dataclass(frozen=True)
class AllocatorConfig:
    """glibc malloc settings of one process (the module's docstring says why these)."""

    # Apply the settings below at start-up; false leaves glibc's own.
    enabled: bool = True
    # Arenas (M_ARENA_MAX): memory freed in one does not serve the others.
    arenas: int = 1
    # Allocations at least this large are mapped on their own and given back when freed.
    mmap_threshold_bytes: int = 32 * MIB
    # Free memory at the heap's top past this much goes back to the system.
    trim_threshold_bytes: int = 64 * MIB
    # Extra memory asked of the system each time the heap grows.
    top_pad_bytes: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.arenas <= 64:
            raise ValueError(f"arenas must be 1..64, not {self.arenas}")
        for name in ("mmap_threshold_bytes", "trim_threshold_bytes", "top_pad_bytes"):
            if not 0 <= getattr(self, name) <= MAX_VALUE:
                raise ValueError(f"{name} must be 0..{MAX_VALUE} (2GiB - 1), not {getattr(self, name)}")

    def settings(self) -> dict[str, tuple[int, int]]:
        """Each setting's name and its (mallopt parameter, value)."""
        return {
            "arenas": (M_ARENA_MAX, self.arenas),
            "mmap_threshold_bytes": (M_MMAP_THRESHOLD, self.mmap_threshold_bytes),
            "trim_threshold_bytes": (M_TRIM_THRESHOLD, self.trim_threshold_bytes),
            "top_pad_bytes": (M_TOP_PAD, self.top_pad_bytes),
        }


# A worker process: what it frees stays for its next step (the module's docstring says why).
WORKER = AllocatorConfig(
    arenas=2, mmap_threshold_bytes=MAX_VALUE, trim_threshold_bytes=MAX_VALUE, top_pad_bytes=256 * MIB
)


def apply_allocator(config: AllocatorConfig) -> dict[str, int]:
    """Set ``config``'s settings on this process's allocator; returns those glibc took (none off
    glibc, or when ``config.enabled`` is false) and logs each one it refused."""
    if not config.enabled or not sys.platform.startswith("linux"):
        return {}
    try:
        # The process's own symbols hold libc's (find_library would start ldconfig to look it up).
        libc = ctypes.CDLL(None)
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        _LOGGER.info("no glibc allocator here: its settings are not applied")
        return {}
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    malloc_trim.argtypes = (ctypes.c_size_t,)
    applied: dict[str, int] = {}
    for name, (parameter, value) in config.settings().items():
        if mallopt(parameter, value) == 1:
            applied[name] = value
        else:
            _LOGGER.warning("the allocator refused %s = %d; glibc's own value stays", name, value)
    if config.top_pad_bytes == 0:
        # Padding left at the heap's top by earlier growth would otherwise be cut into (and kept).
        malloc_trim(0)
    _LOGGER.info("allocator settings applied: %s", applied)
    return applied
