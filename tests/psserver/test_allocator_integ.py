"""The server's allocator settings: one arena, and shard-sized buffers mapped on their own and given
back when freed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from psproto.tuning import MALLOC_SETTINGS, wanted_environment
from psserver.allocator import (
    ARENAS_VARIABLE,
    DEFAULT_ARENAS,
    MAX_ARENAS,
    MAX_MMAP_MIB,
    arenas_in_effect,
    arenas_override,
    map_large_buffers,
    requested_arenas,
)

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


# -- the arena cap of ``psserver serve`` (--malloc-arenas) ----------------------------------------


def test_serve_asks_for_one_arena_unless_its_flag_says_otherwise() -> None:
    assert requested_arenas(["serve", "--port", "0"]) == DEFAULT_ARENAS == 1
    assert requested_arenas(["serve", "--malloc-arenas", "2"]) == 2
    assert requested_arenas(["serve", "--malloc-arenas=3", "--port", "0"]) == 3
    # Not serve, or a value the flag's parser refuses (click then says why): nothing is set.
    assert requested_arenas(["status", "--address", "x:1"]) is None
    assert requested_arenas(["serve", "--malloc-arenas", "0"]) is None
    assert requested_arenas(["serve", "--malloc-arenas", f"{MAX_ARENAS + 1}"]) is None
    assert requested_arenas(["serve", "--malloc-arenas", "two"]) is None
    assert arenas_override(["status"]) == {}


def test_the_serve_arena_cap_replaces_the_one_a_tuned_parent_passes_down() -> None:
    """A parent that ran the entry-point tuning (a benchmark, a launcher) exports two arenas; the
    server's own cap must win, or the server keeps the arena split that raises its peak."""
    inherited = dict(MALLOC_SETTINGS)
    assert inherited[ARENAS_VARIABLE] == "2"
    override = arenas_override(["serve"])
    assert wanted_environment(inherited, override) == {ARENAS_VARIABLE: "1"}
    assert wanted_environment({**inherited, **override}, override) == {}  # applied: no second re-exec
    assert wanted_environment({**inherited, "HETPS_MALLOC_TUNING": "0"}, override) == {}  # tuning off
    assert arenas_in_effect({ARENAS_VARIABLE: "1"}) == 1
    assert arenas_in_effect({}) is None


def _server_environment(tmp_path: Path, *flags: str) -> dict[str, str]:
    """The environment a ``python -m psserver serve`` process serves with, started by a tuned parent."""
    ready = tmp_path / f"ready{len(flags)}.json"
    command = [sys.executable, "-m", "psserver", "serve", "--port", "0", "--no-metrics", "--ready-file", str(ready)]
    process = subprocess.Popen(
        [*command, *flags], env={**os.environ, **MALLOC_SETTINGS}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        # The entry point re-executes itself (same pid): this is the serving program's environment.
        entries = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        return dict(entry.decode().partition("=")[::2] for entry in entries if entry)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator, /proc")
def test_a_served_shard_runs_on_the_arenas_of_its_flag(tmp_path: Path) -> None:
    assert _server_environment(tmp_path)[ARENAS_VARIABLE] == "1"
    assert _server_environment(tmp_path, "--malloc-arenas", "2")[ARENAS_VARIABLE] == "2"
