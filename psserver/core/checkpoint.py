"""Checkpoints of a shard on disk: written atomically, the last K kept, the newest intact one restored.

A checkpoint is ``Shard.state_dict()`` saved as ``ckpt-<sequence>-clock-<clock>.pt`` in the
checksummed form of ``psserver.core.checkpoint_file`` (a header with the SHA-256 of the
``torch.save`` payload). Writing goes to a hidden temporary file in the same folder, which is
flushed and fsynced, then renamed over the final name and the folder fsynced: a crash leaves
either the previous checkpoint or the new one, never half of one, and the checksum travels in
the same file, so it always describes the content beside it. Reading verifies the checksum
before anything is unpickled, with ``torch.load(weights_only=True)``, which builds tensors and
plain values only. Files of the previous format (no header) are still read, as unverified.

On start (``restore``) the temporaries a crash left are deleted (and logged), and the newest
checkpoint that is intact is restored: a damaged newer one (checksum mismatch, truncated,
unreadable) is skipped with a warning naming it; when every one is damaged the restore is
refused. ``inspect_directory`` reports every file's state for ``psserver checkpoints DIR``.

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

from psserver.core.checkpoint_file import (
    CheckpointError,
    DamagedCheckpointError,
    Verdict,
    read_state,
    verify,
    write_state,
)
from psserver.core.observer import NullObserver
from psserver.core.shard import Shard, StateError

_LOGGER = logging.getLogger(__name__)
_NAME = re.compile(r"^ckpt-(\d{8})-clock-(\d+)\.pt$")
# Where a checkpoint is written before its rename: ``.<final name>.tmp-<pid>``.
_TEMPORARY = ".ckpt-*.tmp-*"

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "DamagedCheckpointError",
    "FileReport",
    "Written",
    "inspect_directory",
    "list_checkpoints",
    "load_latest",
    "read_checkpoint",
    "remove_temporaries",
    "restore",
    "temporaries",
    "write_checkpoint",
]


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
    """Write ``state`` atomically as the next checkpoint in ``directory``; keep the newest ``keep``.

    Raises ``CheckpointError`` for any failure to write (the directory cannot be made, is a
    file, the disk is full); the temporary file is removed then."""
    started = time.perf_counter()
    clock = int(state["clock"])
    temporary: Path | None = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        existing = list_checkpoints(directory)
        sequence = existing[-1][0] + 1 if existing else 1
        final = directory / f"ckpt-{sequence:08d}-clock-{clock}.pt"
        temporary = directory / f".{final.name}.tmp-{os.getpid()}"
        with temporary.open("wb") as stream:
            write_state(stream, state)
            os.fsync(stream.fileno())
        os.replace(temporary, final)
        _fsync_directory(directory)
    except BaseException as error:
        # Whatever stopped the write (the disk, or torch.save itself) leaves no temporary behind.
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise CheckpointError(f"cannot write a checkpoint in {directory}: {error}") from error
        raise
    for _, _, old in list_checkpoints(directory)[:-keep]:
        try:
            old.unlink(missing_ok=True)
        except OSError as error:  # the new checkpoint is safe; an old one left behind is only disk
            _LOGGER.warning("cannot remove the old checkpoint %s: %s", old, error)
    return Written(final, clock, time.perf_counter() - started)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The state in checkpoint ``path``, its checksum verified (a file of the previous format is
    read unverified). Raises ``DamagedCheckpointError`` or ``OSError``."""
    state, _ = read_state(path)
    return state


def load_latest(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that is intact, or None when there is none.

    A damaged newer file (bit rot, a disk that lied about fsync, a partial overwrite) is skipped
    with a warning naming it and the problem, and the one before it is used. Raises
    ``CheckpointError`` when files exist but none is intact."""
    found = list_checkpoints(directory)
    problems: list[str] = []
    for _, _, path in reversed(found):
        try:
            state, verified = read_state(path)
        except (DamagedCheckpointError, OSError) as error:
            problem = error.problem if isinstance(error, DamagedCheckpointError) else f"unreadable: {error}"
            problems.append(f"{path.name}: {problem}")
            _LOGGER.warning("skipping damaged checkpoint %s (%s); trying the one before it", path, problem)
            continue
        if not verified:
            _LOGGER.warning("checkpoint %s has no checksum (written before checksums): restored unverified", path)
        if problems:
            _LOGGER.warning(
                "restoring %s, older than the newest: %d newer checkpoint(s) were damaged", path.name, len(problems)
            )
        return path, state
    if found:
        raise CheckpointError(
            f"{len(found)} checkpoint file(s) in {directory} and none can be read ({'; '.join(problems)}); "
            "move them away to start fresh"
        )
    return None


def temporaries(directory: Path) -> list[Path]:
    """The half-written temporaries in ``directory`` (a writer's crash leaves them), sorted."""
    return sorted(directory.glob(_TEMPORARY)) if directory.is_dir() else []


def remove_temporaries(directory: Path) -> list[Path]:
    """Delete the temporaries a crash left behind, logging each; returns those removed."""
    removed = []
    for path in temporaries(directory):
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as error:
            _LOGGER.warning("cannot remove the half-written checkpoint %s: %s", path, error)
            continue
        _LOGGER.warning("removed %s: a checkpoint half-written when a server stopped mid-write", path)
        removed.append(path)
    return removed


def _prepare(directory: Path) -> None:
    """Make ``directory`` (a start fails here, not at the first checkpoint, when it cannot be)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CheckpointError(f"cannot use {directory} for checkpoints: {error}") from None
    if not directory.is_dir():
        raise CheckpointError(f"{directory} is not a directory; checkpoints need one")


def restore(shard: Shard, directory: Path, observer: CheckpointObserver | None = None) -> Path | None:
    """Restore ``shard`` from the newest intact checkpoint in ``directory``; the file used, or None.

    Makes ``directory`` if it does not exist and removes the temporaries a crash left in it.
    Raises ``CheckpointError`` (not a usable directory, or none intact) or
    ``psserver.core.shard.StateError`` (another rule or shard); the shard is unchanged then."""
    _prepare(directory)
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


@dataclass(frozen=True)
class FileReport:
    """One checkpoint file as ``inspect_directory`` found it."""

    path: Path
    sequence: int
    clock: int
    size: int
    # Unix time it was written (the file's modification time: the rename keeps the write's).
    modified: float
    verdict: Verdict


def inspect_directory(directory: Path) -> list[FileReport]:
    """Every checkpoint in ``directory``, oldest first, each checked (checksums read in full).

    A file that a running server removes meanwhile (it keeps the newest K) is left out."""
    reports = []
    for sequence, clock, path in list_checkpoints(directory):
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        try:
            verdict = verify(path)
        except FileNotFoundError:
            continue
        except OSError as error:
            verdict = Verdict("damaged", f"unreadable: {error.strerror or error}")
        reports.append(FileReport(path, sequence, clock, stat.st_size, stat.st_mtime, verdict))
    return reports


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
