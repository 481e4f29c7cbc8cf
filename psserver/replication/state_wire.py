"""A shard's state (``Shard.state_dict()``) as one byte string and back, for the replicas.

The tensors (the parameters, the rule's state) travel as their raw bytes, never a pickle of them
(``torch.save`` of a 45 MB shard costs 70-100 ms each way, a copy about 10). The rest (clocks,
workers, their push-id memories: up to ``RECENT_PUSHES_KEPT`` outcomes a worker, so it grows with
the workers, not the model) travels as JSON, which the standard library parses in C; a
``torch.save`` read back with ``weights_only`` goes through an unpickler written in Python. A
description in that older form (a replica of an earlier release, during a rolling upgrade) is
still read.

Layout: 8 bytes of the description's length (little-endian), the description, then each
tensor's bytes in the order the description lists them, each starting at a multiple of 64 bytes
(zeros between) so the tensors read in place are aligned.
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from typing_extensions import Buffer

_LENGTH = struct.Struct("<Q")
_TENSORS = "replicated_tensors"
_ALIGN = 64
# torch.save's archives are zip files.
_ZIP_MAGIC = b"PK\x03\x04"
# What reading a damaged state raises (JSON's errors are ValueErrors).
_DAMAGED = (struct.error, RuntimeError, EOFError, KeyError, TypeError, AttributeError, ValueError)


def _padding(offset: int) -> int:
    return -offset % _ALIGN


@dataclass(frozen=True)
class EncodedState:
    """A state ready to send: its parts in order (``memoryview``s of the tensors, no copy)."""

    parts: tuple[memoryview, ...]
    clock: int

    @property
    def total_bytes(self) -> int:
        return sum(part.nbytes for part in self.parts)

    def digest(self) -> str:
        hasher = hashlib.sha256()
        for part in self.parts:
            hasher.update(part)
        return hasher.hexdigest()


def _raw(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().contiguous().reshape(-1)
    return bytes_of(flat.view(torch.uint8)) if flat.numel() else memoryview(b"")


def bytes_of(tensor: torch.Tensor) -> memoryview:
    """The memory of a contiguous CPU tensor, without a copy."""
    return memoryview(cast(Buffer, tensor.numpy()))


def encode(state: Mapping[str, Any]) -> EncodedState:
    """``state``'s parts; the tensors are the state's own (a captured state is a copy already)."""
    tensors: list[tuple[str, torch.Tensor]] = [("params", state["params"])]
    tensors += [(f"rule_state/{name}", value) for name, value in state["rule_state"].items()]
    described = {key: value for key, value in state.items() if key not in ("params", "rule_state")}
    described[_TENSORS] = [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in tensors]
    head = json.dumps(described, separators=(",", ":")).encode()
    parts = [memoryview(_LENGTH.pack(len(head))), memoryview(head)]
    offset = _LENGTH.size + len(head)
    for _, tensor in tensors:
        parts.append(memoryview(bytes(_padding(offset))))
        raw = _raw(tensor)
        parts.append(raw)
        offset += parts[-2].nbytes + raw.nbytes
    return EncodedState(tuple(parts), int(state.get("clock", 0)))


def decode(data: Buffer) -> dict[str, Any]:
    """The state ``encode`` described; its tensors share ``data``'s memory. ValueError if damaged."""
    view = memoryview(data)
    try:
        (length,) = _LENGTH.unpack_from(view, 0)
        start = _LENGTH.size + length
        described = _described(view[_LENGTH.size : start])
        tensors: dict[str, torch.Tensor] = {}
        for name, dtype_name, shape in described.pop(_TENSORS):
            start += _padding(start)
            dtype = getattr(torch, dtype_name)
            count = 1
            for size in shape:
                count *= int(size)
            nbytes = count * torch.empty((), dtype=dtype).element_size()
            if start + nbytes > len(view):
                raise ValueError(f"a damaged replica state: it ends inside tensor {name}")
            flat = (
                torch.frombuffer(view, dtype=dtype, count=count, offset=start) if count else torch.empty(0, dtype=dtype)
            )
            tensors[name] = flat.view(shape)
            start += nbytes
    except _DAMAGED as error:
        raise ValueError(f"a damaged replica state: {error!r}") from None
    if start != len(view):
        raise ValueError(f"a replica state of {len(view)} bytes describes {start}")
    described["params"] = tensors.pop("params")
    described["rule_state"] = {name.removeprefix("rule_state/"): t for name, t in tensors.items()}
    return described


def _described(head: memoryview) -> dict[str, Any]:
    """The description: JSON, or (from an earlier release) a ``torch.save`` of plain values."""
    start = bytes(head[:4])
    if start.startswith(b"{"):
        loaded = json.loads(bytes(head))
    elif start == _ZIP_MAGIC:
        try:
            loaded = torch.load(io.BytesIO(head), weights_only=True)
        except Exception as error:  # torch's unpickler raises most kinds on damaged bytes
            raise ValueError(f"the description does not load: {error!r}") from None
    else:
        raise ValueError("the description is neither JSON nor an earlier release's torch.save")
    if not isinstance(loaded, dict):
        raise TypeError(f"the description is a {type(loaded).__name__}, not a table")
    return loaded


def digest_of(data: Buffer) -> str:
    return hashlib.sha256(data).hexdigest()
