"""One checkpoint file: a checksummed ``torch.save`` payload, written whole and verified before it is read.

Layout (all little-endian)::

    magic   8 bytes   b"HETPSCKP"
    version u16       1
    digest  u16       1 = SHA-256
    length  u64       bytes of payload that follow
    sha256  32 bytes  of the payload
    payload           torch.save(state)

Why a header in the same file rather than a checksum beside it: the checkpointer writes a
checkpoint to a temporary name, fsyncs it and renames it into place (``psserver.core.checkpoint``).
With the checksum inside, that one rename publishes the content and its checksum together, so
no crash can leave a checkpoint whose checksum is of another content (a sidecar needs a second
rename, and a crash between the two leaves a pair that disagree), and copying or exporting one
file keeps its checksum. The header is written last, over a zeroed placeholder, once the
payload's length and digest are known, so the payload streams through the hash on its way to
disk and is never held twice in memory.

What a reader learns: ``ok`` (the payload is byte for byte what was written), ``unverified``
(a checkpoint of the previous format, a bare ``torch.save`` with no header: readable, but
nothing proves it is intact), or ``damaged`` with the reason (checksum mismatch, truncated,
longer than written, unreadable, not a hetps checkpoint). Damaged files raise
``DamagedCheckpointError``; callers skip or refuse them, they are never loaded.
"""

from __future__ import annotations

import hashlib
import io
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, cast

import torch

MAGIC = b"HETPSCKP"
FILE_VERSION = 1
_SHA256 = 1
HEADER = struct.Struct("<8sHHQ32s")
_READ_BLOCK = 1 << 20

Status = Literal["ok", "unverified", "damaged"]


class CheckpointError(RuntimeError):
    """Checkpoints exist but none can be read, or a write failed."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint file whose bytes are not what was written; ``problem`` says how."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


@dataclass(frozen=True)
class Verdict:
    """What checking a file found: ``problem`` is None unless ``status`` is ``damaged``."""

    status: Status
    problem: str | None = None


class _HashingWriter:
    """Passes ``torch.save``'s writes to ``stream`` and hashes and counts them on the way."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self.hash = hashlib.sha256()
        self.length = 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        written = self._stream.write(data)
        self.length += written
        return written

    def flush(self) -> None:
        self._stream.flush()


def write_state(stream: IO[bytes], state: dict[str, Any]) -> None:
    """Write ``state`` with its header to ``stream`` (a new file, seekable); the caller fsyncs it."""
    # A zeroed header until the digest is known: a crash before the seek leaves no valid magic.
    stream.write(bytes(HEADER.size))
    hashing = _HashingWriter(stream)
    # torch.save only calls write() and flush() on a stream (its zip writer counts offsets itself).
    torch.save(state, cast(IO[bytes], hashing))
    stream.seek(0)
    stream.write(HEADER.pack(MAGIC, FILE_VERSION, _SHA256, hashing.length, hashing.hash.digest()))
    stream.flush()


@dataclass(frozen=True)
class _Header:
    length: int
    digest: bytes


def _header(path: Path, head: bytes, size: int) -> _Header | None:
    """The parsed header, None for a file of the previous format; raises on a damaged one."""
    if size == 0:
        raise DamagedCheckpointError(path, "truncated: the file is empty")
    if not head.startswith(MAGIC):
        if MAGIC.startswith(head):
            raise DamagedCheckpointError(path, f"truncated: {size} bytes, shorter than its header")
        return None
    if len(head) < HEADER.size:
        raise DamagedCheckpointError(path, f"truncated: {size} bytes, shorter than its header")
    _, version, digest_kind, length, digest = HEADER.unpack(head)
    if version != FILE_VERSION or digest_kind != _SHA256:
        raise DamagedCheckpointError(
            path, f"unknown checkpoint file version {version} (digest {digest_kind}): a damaged header or a newer hetps"
        )
    payload = size - HEADER.size
    if payload < length:
        raise DamagedCheckpointError(path, f"truncated: {payload} of {length} payload bytes")
    if payload > length:
        raise DamagedCheckpointError(path, f"{payload - length} bytes longer than written")
    return _Header(length, digest)


_MISMATCH = "checksum mismatch: the content changed after it was written"


def _load(source: Path | IO[bytes], path: Path) -> dict[str, Any]:
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as error:  # torch.load raises many kinds on a damaged payload
        raise DamagedCheckpointError(path, f"unreadable: {type(error).__name__}: {_first_line(error)}") from None
    if not isinstance(state, dict) or "format" not in state:
        raise DamagedCheckpointError(path, "not a hetps checkpoint")
    return state


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"


def read_state(path: Path) -> tuple[dict[str, Any], bool]:
    """The state saved in ``path`` and whether its checksum proved it intact (False: previous format).

    Raises ``DamagedCheckpointError`` for a damaged file, ``OSError`` when it cannot be opened."""
    with path.open("rb") as stream:
        size = path.stat().st_size
        head = stream.read(HEADER.size)
        header = _header(path, head, size)
        if header is None:
            stream.seek(0)
            return _load(stream, path), False
        payload = stream.read()
    if hashlib.sha256(payload).digest() != header.digest:
        raise DamagedCheckpointError(path, _MISMATCH)
    # BytesIO over a bytes object shares its buffer: the payload is not copied again.
    return _load(io.BytesIO(payload), path), True


def verify(path: Path) -> Verdict:
    """Check ``path`` without keeping its state: the checksum of a current file (read in blocks),
    a full read of a previous-format one. Raises ``OSError`` when it cannot be opened."""
    with path.open("rb") as stream:
        size = path.stat().st_size
        try:
            header = _header(path, stream.read(HEADER.size), size)
        except DamagedCheckpointError as error:
            return Verdict("damaged", error.problem)
        if header is None:
            stream.seek(0)
            try:
                _load(stream, path)
            except DamagedCheckpointError as error:
                return Verdict("damaged", error.problem)
            return Verdict("unverified")
        digest = hashlib.sha256()
        while block := stream.read(_READ_BLOCK):
            digest.update(block)
    return Verdict("ok") if digest.digest() == header.digest else Verdict("damaged", _MISMATCH)
