"""The server's allocator setting: shard-sized buffers mapped on their own and given back when freed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from psproto.tuning import MALLOC_SETTINGS
from psserver.allocator import MAX_MMAP_MIB, map_large_buffers

# Run in a fresh interpreter under the settings the psserver entry point starts with: what the
# heap already holds depends on everything a process did before, so the pytest process, after
# hundreds of tests, says nothing about a server's. glibc serves a request from any free chunk
# large enough before it maps one, so the probe frees no large block of its own first: which
# free chunks a freed block leaves (merged into the top, or kept in a bin) depends on what
# other threads allocated meanwhile, and a kept one would serve the shard-sized buffer.
_PROBE = """
import ctypes, json, sys
import torch
from psserver.allocator import map_large_buffers

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
applied = map_large_buffers(int(sys.argv[1]))
before = libc.mallinfo2().hblkhd
buffer = torch.ones(12 * 1024 * 1024)  # 48 MiB, a ResNet-18-sized shard
while_held = libc.mallinfo2().hblkhd - before
del buffer
after_free = libc.mallinfo2().hblkhd - before
print(json.dumps({"applied": applied, "while_held": while_held, "after_free": after_free}))
"""
_SHARD_BYTES = 12 * 1024 * 1024 * 4


def _probe(threshold_mib: int) -> dict[str, int]:
    environment = {**os.environ, **MALLOC_SETTINGS}
    completed = subprocess.run(
        [sys.executable, "-c", _PROBE, str(threshold_mib)],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return dict(json.loads(completed.stdout.strip().splitlines()[-1]))


def test_out_of_range_thresholds_are_refused_and_0_changes_nothing() -> None:
    with pytest.raises(ValueError, match=f"0 to {MAX_MMAP_MIB} MiB"):
        map_large_buffers(MAX_MMAP_MIB + 1)
    with pytest.raises(ValueError, match="not -1"):
        map_large_buffers(-1)
    assert map_large_buffers(0) is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_buffer_above_the_threshold_is_mapped_and_given_back_when_freed() -> None:
    result = _probe(MAX_MMAP_MIB)
    assert result["applied"]
    assert result["while_held"] >= _SHARD_BYTES
    assert result["after_free"] < 1024 * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_without_the_setting_the_start_up_heap_keeps_the_buffer() -> None:
    """The peer of the test above: what the setting changes (the entry point's padding alone
    cuts the shard from the heap, where it stays)."""
    result = _probe(0)
    assert not result["applied"]
    assert result["while_held"] == 0
