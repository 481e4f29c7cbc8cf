"""The allocator policy (psserver.allocator): shard-sized buffers mapped on their own and given back
when freed, messages kept in the heap, every setting applied with mallopt and checked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from psserver.allocator import MAX_VALUE, MIB, WORKER, AllocatorConfig, apply_allocator

# Run in a fresh interpreter: what the heap already holds depends on everything a process did
# before, so the pytest process, after hundreds of tests, says nothing about a server's. glibc
# serves a request from any free chunk large enough before it maps one, so the probe frees no
# large block of its own first.
_PROBE = """
import ctypes, json, sys
import torch
from psserver.allocator import AllocatorConfig, apply_allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
applied = apply_allocator(AllocatorConfig(enabled=sys.argv[1] == "on"))
before = libc.mallinfo2().hblkhd
buffer = torch.ones(12 * 1024 * 1024)  # 48 MiB, a ResNet-18-sized shard
while_held = libc.mallinfo2().hblkhd - before
del buffer
after_free = libc.mallinfo2().hblkhd - before
small = [bytearray(2 * 1024 * 1024) for _ in range(4)]  # a message's size: from the heap
small_mapped = libc.mallinfo2().hblkhd - before
print(json.dumps({"applied": applied, "while_held": while_held, "after_free": after_free, "small": small_mapped}))
"""
_SHARD_BYTES = 12 * 1024 * 1024 * 4
_GLIBC = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")


def _probe(enabled: bool) -> dict[str, object]:
    completed = subprocess.run(
        [sys.executable, "-c", _PROBE, "on" if enabled else "off"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return dict(json.loads(completed.stdout.strip().splitlines()[-1]))


@_GLIBC
def test_every_setting_is_taken_a_shard_sized_buffer_is_mapped_and_given_back_and_messages_stay_in_the_heap() -> None:
    result = _probe(enabled=True)
    assert result["applied"] == {
        "arenas": 1,
        "mmap_threshold_bytes": 32 * MIB,
        "trim_threshold_bytes": 64 * MIB,
        "top_pad_bytes": 0,
    }
    assert result["while_held"] >= _SHARD_BYTES  # type: ignore[operator]
    assert result["after_free"] < MIB  # type: ignore[operator]
    # glibc's own threshold (128 KiB) would map every one of them.
    assert result["small"] < MIB  # type: ignore[operator]


@_GLIBC
def test_turned_off_nothing_is_applied() -> None:
    assert _probe(enabled=False)["applied"] == {}


def test_settings_glibc_would_refuse_are_refused_when_read() -> None:
    with pytest.raises(ValueError, match=r"mmap_threshold_bytes must be 0\.\.2147483647 \(2GiB - 1\)"):
        AllocatorConfig(mmap_threshold_bytes=2**31)
    with pytest.raises(ValueError, match=r"arenas must be 1\.\.64, not 0"):
        AllocatorConfig(arenas=0)
    with pytest.raises(ValueError, match=r"trim_threshold_bytes must be 0\.\.2147483647"):
        AllocatorConfig(trim_threshold_bytes=2**31)
    assert (WORKER.arenas, WORKER.mmap_threshold_bytes, WORKER.top_pad_bytes) == (2, MAX_VALUE, 256 * MIB)


@_GLIBC
def test_a_setting_glibc_refuses_is_logged_and_left_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # glibc refuses a fast-bin limit (M_MXFAST, 1) above 160 bytes, as older ones refuse a large threshold.
    config = AllocatorConfig()
    monkeypatch.setattr(AllocatorConfig, "settings", lambda self: {"fast_bins": (1, 10**6), "arenas": (-8, 1)})
    with caplog.at_level("WARNING", logger="psserver.allocator"):
        assert apply_allocator(config) == {"arenas": 1}
    assert "the allocator refused fast_bins = 1000000" in caplog.text


def test_nothing_re_executes_the_process() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for package in ("psproto", "psserver", "psworker", "pstools"):
        for path in (root / package).rglob("*.py"):
            assert "os.execv" not in path.read_text(), path
