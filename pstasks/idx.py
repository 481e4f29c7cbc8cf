"""Read IDX files (the MNIST / Fashion-MNIST format), gzipped or plain, into uint8 tensors.

An IDX file is a 4-byte magic number (two zero bytes, a type byte, the number of dimensions),
one big-endian uint32 per dimension, then the values. Only unsigned bytes (type 0x08) are read,
the type every MNIST-style file uses. The values go straight into one preallocated buffer that
the returned tensor wraps: nothing is copied after decompression. Every problem (file missing,
wrong magic number, fewer or more bytes than the header says) raises :class:`IdxError` naming
the file.
"""

from __future__ import annotations

import gzip
import io
import struct
from pathlib import Path

import torch

IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions (count, rows, columns)
LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension (count)
_READ_CHUNK_BYTES = 1 << 20


class IdxError(ValueError):
    """An IDX file that is missing or malformed; the message names the file and what is wrong."""

    def __init__(self, path: Path, problem: str, hint: str = "") -> None:
        self.path = path
        self.problem = problem
        self.hint = hint
        super().__init__(f"{path}: {problem}" + (f"; {hint}" if hint else ""))


def find_idx(directory: Path, name: str, hint: str = "") -> Path:
    """``directory/name.gz`` or ``directory/name``, whichever exists (the gzipped one first)."""
    for candidate in (directory / f"{name}.gz", directory / name):
        if candidate.is_file():
            return candidate
    problem = "not found" if directory.is_dir() else f"not found: there is no directory {directory}"
    raise IdxError(directory / f"{name}[.gz]", problem, hint)


def _open(path: Path) -> io.BufferedIOBase:
    with path.open("rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else path.open("rb")


def _read_into(stream: io.BufferedIOBase, buffer: bytearray) -> int:
    view = memoryview(buffer)
    filled = 0
    while filled < len(buffer):
        got = stream.readinto(view[filled : filled + _READ_CHUNK_BYTES])
        if not got:
            break
        filled += got
    return filled


def read_idx(path: Path, magic: int, hint: str = "") -> torch.Tensor:
    """The file's values as a uint8 tensor of the header's shape; ``magic`` is the number expected."""
    if not path.is_file():
        raise IdxError(path, "not found", hint)
    try:
        with _open(path) as stream:
            head = stream.read(4)
            if len(head) < 4:
                raise IdxError(path, f"truncated: {len(head)} bytes, shorter than an IDX header", hint)
            (found,) = struct.unpack(">I", head)
            if found != magic:
                raise IdxError(path, f"bad magic number {found} (expected {magic}): not this kind of IDX file", hint)
            ndim = head[3]  # the magic number holds the type (unsigned bytes) and the dimension count
            dims_bytes = stream.read(4 * ndim)
            if len(dims_bytes) < 4 * ndim:
                raise IdxError(path, f"truncated: the header's {ndim} dimensions are not all there", hint)
            shape = struct.unpack(f">{ndim}I", dims_bytes)
            expected = 1
            for size in shape:
                expected *= size
            buffer = bytearray(expected)
            filled = _read_into(stream, buffer)
            if filled < expected:
                raise IdxError(
                    path, f"truncated: {filled} of the {expected} value bytes its header {list(shape)} promises", hint
                )
            if stream.read(1):
                raise IdxError(path, f"longer than its header {list(shape)} says: extra bytes after the values", hint)
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise IdxError(path, f"cannot be read ({error})", hint) from None
    if expected == 0:
        return torch.zeros(shape, dtype=torch.uint8)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(shape)


def read_images_and_labels(images_path: Path, labels_path: Path, hint: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """An images file (count × rows × columns) and its labels file (count), checked against each other."""
    images = read_idx(images_path, IMAGES_MAGIC, hint)
    labels = read_idx(labels_path, LABELS_MAGIC, hint)
    if images.shape[0] != labels.shape[0]:
        raise IdxError(
            labels_path, f"{labels.shape[0]} labels for the {images.shape[0]} images of {images_path.name}", hint
        )
    return images, labels
