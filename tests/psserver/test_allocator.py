"""The server's allocator setting: shard-sized buffers mapped on their own and given back when freed."""

from __future__ import annotations

import ctypes
import sys

import pytest
import torch

from psserver.allocator import MAX_MMAP_MIB, map_large_buffers


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ]


def _mapped_bytes() -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    return int(libc.mallinfo2().hblkhd)


def test_out_of_range_thresholds_are_refused_and_0_changes_nothing() -> None:
    with pytest.raises(ValueError, match=f"0 to {MAX_MMAP_MIB} MiB"):
        map_large_buffers(MAX_MMAP_MIB + 1)
    with pytest.raises(ValueError, match="not -1"):
        map_large_buffers(-1)
    assert map_large_buffers(0) is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_buffer_above_the_threshold_is_mapped_and_given_back_when_freed() -> None:
    assert map_large_buffers(MAX_MMAP_MIB)
    before = _mapped_bytes()
    buffer = torch.ones(12 * 1024 * 1024)  # 48 MiB, a ResNet-18-sized shard
    assert _mapped_bytes() - before >= buffer.numel() * 4
    del buffer
    assert _mapped_bytes() - before < 1024 * 1024
