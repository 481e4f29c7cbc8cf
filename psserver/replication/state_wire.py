"""A shard's state (``Shard.state_dict()``) as one byte string and back, for the replicas.

The tensors (the parameters, the rule's state) travel as their raw bytes, the rest as a small
``torch.save`` read back with ``weights_only``: both ways are copies, never a pickle of the
tensors (``torch.save`` of a 45 MB shard costs 70-100 ms each way, a copy about 10).

Layout: 8 bytes of the description's length (little-endian), the description, then each
tensor's bytes in the order the description lists them, each starting at a multiple of 64 bytes
(zeros between) so the tensors read in place are aligned.
"""

from __future__ import annotations

import hashlib
import io
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from typing_extensions import Buffer

_LENGTH = struct.Struct("<Q")
_TENSORS = "replicated_tensors"
_ALIGN = 64


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
    buffer = io.BytesIO()
    torch.save(described, buffer)
    head = buffer.getvalue()
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
        described: dict[str, Any] = torch.load(io.BytesIO(view[_LENGTH.size : start]), weights_only=True)
        tensors: dict[str, torch.Tensor] = {}
        for name, dtype_name, shape in described.pop(_TENSORS):
            start += _padding(start)
            dtype = getattr(torch, dtype_name)
            count = 1
            for size in shape:
                count *= int(size)
            nbytes = count * torch.empty((), dtype=dtype).element_size()
            if start + nbytes > len(view):
                raise ValueError(f"the state ends inside tensor {name}")
            flat = (
                torch.frombuffer(view, dtype=dtype, count=count, offset=start) if count else torch.empty(0, dtype=dtype)
            )
            tensors[name] = flat.view(shape)
            start += nbytes
    except (struct.error, RuntimeError, EOFError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"a damaged replica state: {error!r}") from None
    if start != len(view):
        raise ValueError(f"a replica state of {len(view)} bytes describes {start}")
    described["params"] = tensors.pop("params")
    described["rule_state"] = {name.removeprefix("rule_state/"): t for name, t in tensors.items()}
    return described


def digest_of(data: Buffer) -> str:
    return hashlib.sha256(data).hexdigest()
