"""Checkpoints of a shard on disk: written atomically, the last K kept, the newest readable restored.

A checkpoint is ``Shard.state_dict()`` saved with ``torch.save`` as
``ckpt-<sequence>-clock-<clock>.pt``. Writing goes to a hidden temporary file in the same
folder, which is flushed and fsynced, then renamed over the final name and the folder fsynced:
a crash leaves either the previous checkpoint or the new one, never half of one. Reading uses
``torch.load(weights_only=True)``, which builds tensors and plain values only.

``Checkpointer`` writes one every N updates (it subscribes to the shard as a ``ShardObserver``,
and the state is captured inside the update that reaches the multiple of N, so it includes that
update's push id) and/or every S seconds when the clock moved, on a background thread;
``write_now`` serves the admin RPC and shutdown.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from psserver.core.observer import NullObserver
from psserver.core.shard import Shard, StateError

_LOGGER = logging.getLogger(__name__)
_NAME = re.compile(r"^ckpt-(\d{8})-clock-(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """Checkpoints exist but none can be read, or a write failed."""


class CheckpointObserver(Protocol):
    def checkpoint_written(self, timestamp: float | None = None) -> None: ...

    def clock_restored(self, clock: int) -> None: ...


@dataclass(frozen=True)
class Written:
    path: Path
    clock: int
    seconds: float


def list_checkpoints(directory: Path) -> list[tuple[int, int, Path]]:
    """(sequence, clock, path) of every checkpoint file in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), int(match.group(2)), path))
    return sorted(found)


def write_checkpoint(directory: Path, state: dict[str, Any], keep: int) -> Written:
    """Write ``state`` atomically as the next checkpoint in ``directory``; keep the newest ``keep``."""
    started = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    existing = list_checkpoints(directory)
    sequence = existing[-1][0] + 1 if existing else 1
    clock = int(state["clock"])
    final = directory / f"ckpt-{sequence:08d}-clock-{clock}.pt"
    temporary = directory / f".{final.name}.tmp-{os.getpid()}"
    try:
        with temporary.open("wb") as stream:
            torch.save(state, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, final)
        _fsync_directory(directory)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise CheckpointError(f"cannot write a checkpoint in {directory}: {error}") from error
    for _, _, old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return Written(final, clock, time.perf_counter() - started)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_checkpoint(path: Path) -> dict[str, Any]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "format" not in state:
        raise CheckpointError(f"{path} is not a hetps checkpoint")
    return state


def load_latest(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that reads back, or None when there is none.

    A damaged newest file (say, a disk that lied about fsync) is skipped with a warning and
    the one before it is used. Raises ``CheckpointError`` when files exist but none reads."""
    found = list_checkpoints(directory)
    for _, _, path in reversed(found):
        try:
            return path, read_checkpoint(path)
        except Exception as error:  # torch.load raises many kinds on a damaged file
            _LOGGER.warning("skipping unreadable checkpoint %s: %s", path, error)
    if found:
        raise CheckpointError(
            f"{len(found)} checkpoint file(s) in {directory} and none can be read; move them away to start fresh"
        )
    return None


def remove_temporaries(directory: Path) -> None:
    """Delete half-written temporaries a crash left behind."""
    if directory.is_dir():
        for path in directory.glob(".ckpt-*.tmp-*"):
            path.unlink(missing_ok=True)


def restore(shard: Shard, directory: Path, observer: CheckpointObserver | None = None) -> Path | None:
    """Restore ``shard`` from the newest readable checkpoint in ``directory``; the file used, or None.

    Raises ``CheckpointError`` (unreadable) or ``psserver.core.shard.StateError`` (another rule
    or shard); the shard is unchanged then."""
    remove_temporaries(directory)
    latest = load_latest(directory)
    if latest is None:
        return None
    path, state = latest
    try:
        shard.load_state_dict(state)
    except StateError as error:
        raise StateError(f"{path}: {error}") from None
    if observer is not None:
        observer.checkpoint_written(float(state.get("written_at", time.time())))
        observer.clock_restored(shard.clock)
    return path


class _EveryNthUpdate(NullObserver):
    """Hands the state of every ``every``-th update to ``captured`` (called under the shard lock)."""

    def __init__(self, every: int, captured: Callable[[dict[str, Any]], None]) -> None:
        self._every = every
        self._captured = captured

    def update_committed(self, clock: int, capture_state: Callable[[], dict[str, Any]]) -> None:
        if clock % self._every == 0:
            self._captured(capture_state())


class Checkpointer:
    """Writes ``shard``'s checkpoints every ``every_updates`` updates and/or ``every_seconds``."""

    def __init__(
        self,
        shard: Shard,
        directory: Path,
        keep: int = 3,
        every_updates: int = 0,
        every_seconds: float = 0.0,
        observer: CheckpointObserver | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.shard = shard
        self.directory = directory
        self.keep = keep
        self.every_updates = every_updates
        self.every_seconds = every_seconds
        self.observer = observer
        self.last: Written | None = None
        self.failures = 0
        self._write_lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending: dict[str, Any] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_clock = shard.clock
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> None:
        if self.every_updates:
            self._unsubscribe = self.shard.subscribe(_EveryNthUpdate(self.every_updates, self._captured))
        if self.every_updates or self.every_seconds:
            self._thread = threading.Thread(target=self._run, name="checkpointer", daemon=True)
            self._thread.start()

    def _captured(self, state: dict[str, Any]) -> None:
        # Called with the shard lock held: only hand the state over. A newer capture replaces
        # one not written yet.
        with self._pending_lock:
            self._pending = state
        self._wake.set()

    def _run(self) -> None:
        next_timed = time.monotonic() + self.every_seconds if self.every_seconds else None
        while not self._stop.is_set():
            timeout = None if next_timed is None else max(0.0, next_timed - time.monotonic())
            self._wake.wait(timeout)
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._pending_lock:
                state, self._pending = self._pending, None
            if next_timed is not None and time.monotonic() >= next_timed:
                next_timed = time.monotonic() + self.every_seconds
                if state is None and self.shard.clock != self._last_clock:
                    state = self.shard.state_dict()
            if state is not None:
                self._write(state)

    def _write(self, state: dict[str, Any]) -> Written | None:
        with self._write_lock:
            try:
                written = write_checkpoint(self.directory, state, self.keep)
            except CheckpointError as error:
                self.failures += 1
                _LOGGER.error("%s", error)
                return None
            self.last = written
            self._last_clock = written.clock
        if self.observer is not None:
            self.observer.checkpoint_written()
        _LOGGER.info("checkpoint %s written (clock %d, %.3f s)", written.path, written.clock, written.seconds)
        return written

    def write_now(self) -> Written:
        """Capture and write a checkpoint now (admin RPC, shutdown); raises ``CheckpointError``."""
        written = self._write(self.shard.state_dict())
        if written is None:
            raise CheckpointError(f"the checkpoint could not be written in {self.directory}; see the server log")
        return written

    def stop(self) -> None:
        """Stop the background writer (the caller writes the final checkpoint with ``write_now``)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
