"""Model layout: named tensors mapped onto one flat fp32 vector and split into shards.

The layout is a pure function of (names, shapes, number of shards). Its hash is sent on
every Join so that workers with different models can never mix on one server.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

from psproto.v1 import ps_pb2


@dataclass(frozen=True)
class TensorSlot:
    """One model tensor's place in the flat vector."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def end(self) -> int:
        return self.offset + self.numel


@dataclass(frozen=True)
class ShardRange:
    """The contiguous range of the flat vector one shard owns."""

    index: int
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def span(self) -> slice:
        """The range as a slice of the flat vector."""
        return slice(self.offset, self.end)


# Characters the hash text puts between names and shapes (``name:d1,d2;name2:...``).
HASH_SEPARATORS = (":", ";")


class LayoutError(ValueError):
    """A layout that cannot be built (bad names, shapes or shard count)."""


def _check_tensor(name: str, shape: tuple[int, ...]) -> None:
    """A ``LayoutError`` for a tensor name the hash text cannot hold, or a negative dimension."""
    if not name:
        raise LayoutError("tensor names must be non-empty")
    separators = sorted(set(name) & set(HASH_SEPARATORS))
    if separators:
        # The hash text joins names with these; allowing them would let two models share a hash.
        raise LayoutError(
            f"tensor name {name!r} contains {' and '.join(map(repr, separators))}; names may not "
            f"contain any of {' '.join(HASH_SEPARATORS)}"
        )
    if any(dim < 0 for dim in shape):
        raise LayoutError(f"tensor {name!r} has a negative dimension: {shape}")


@dataclass(frozen=True)
class Layout:
    """An ordered list of named tensors and the number of shards that hold them."""

    specs: tuple[tuple[str, tuple[int, ...]], ...]
    num_shards: int = 1

    def __post_init__(self) -> None:
        if not self.specs:
            raise LayoutError("a layout needs at least one tensor")
        if self.num_shards < 1:
            raise LayoutError(f"num_shards must be >= 1, got {self.num_shards}")
        names = [name for name, _ in self.specs]
        if len(set(names)) != len(names):
            raise LayoutError("tensor names in a layout must be unique")
        for name, shape in self.specs:
            _check_tensor(name, shape)
        if self.num_shards > len(self.specs):
            raise LayoutError(
                f"{self.num_shards} shards for {len(self.specs)} tensors: shards are aligned to "
                "tensor boundaries, so use at most one shard per tensor"
            )
        if self.total_length == 0:
            raise LayoutError("the layout holds no parameters (every tensor has a zero dimension)")
        empty = [shard.index for shard in self.shards if shard.length == 0]
        if empty:
            raise LayoutError(
                f"shard(s) {', '.join(map(str, empty))} of {self.num_shards} would hold no parameters "
                "(zero-size tensors at the cut); use fewer shards"
            )

    @classmethod
    def from_named_shapes(cls, named_shapes: Iterable[tuple[str, Sequence[int]]], num_shards: int = 1) -> Layout:
        return cls(tuple((name, tuple(int(d) for d in shape)) for name, shape in named_shapes), num_shards)

    @classmethod
    def from_proto(cls, message: ps_pb2.Layout) -> Layout:
        return cls.from_named_shapes(
            ((spec.name, tuple(spec.shape)) for spec in message.tensors), message.num_shards or 1
        )

    def to_proto(self) -> ps_pb2.Layout:
        return ps_pb2.Layout(
            tensors=[ps_pb2.TensorSpec(name=name, shape=list(shape)) for name, shape in self.specs],
            num_shards=self.num_shards,
        )

    @cached_property
    def slots(self) -> tuple[TensorSlot, ...]:
        slots = []
        offset = 0
        for name, shape in self.specs:
            slot = TensorSlot(name, shape, offset)
            slots.append(slot)
            offset = slot.end
        return tuple(slots)

    @property
    def total_length(self) -> int:
        return self.slots[-1].end

    @cached_property
    def hash(self) -> str:
        """Hex SHA-256 of ``name:dim,dim;...|num_shards`` — the canonical text in docs/protocol.md."""
        text = ";".join(f"{name}:{','.join(map(str, shape))}" for name, shape in self.specs)
        return hashlib.sha256(f"{text}|{self.num_shards}".encode()).hexdigest()

    @cached_property
    def shards(self) -> tuple[ShardRange, ...]:
        """Contiguous shard ranges, balanced by size and cut only at tensor boundaries.

        Shard ``i`` ends at the tensor boundary closest to ``(i + 1) * total / S`` while
        leaving at least one tensor for every later shard.
        """
        boundaries = [slot.end for slot in self.slots]
        total = self.total_length
        cuts = [0]
        for i in range(1, self.num_shards):
            target = total * i / self.num_shards
            lowest = boundaries.index(cuts[-1]) + 1 if cuts[-1] else 0
            highest = len(boundaries) - (self.num_shards - i) - 1
            candidates = range(lowest, highest + 1)
            best = min(candidates, key=lambda k: (abs(boundaries[k] - target), k))
            cuts.append(boundaries[best])
        cuts.append(total)
        return tuple(ShardRange(index=i, offset=cuts[i], length=cuts[i + 1] - cuts[i]) for i in range(self.num_shards))

    def shard(self, index: int) -> ShardRange:
        if not 0 <= index < self.num_shards:
            raise LayoutError(f"shard index {index} is outside 0..{self.num_shards - 1}")
        return self.shards[index]

    def segments(self, shard_index: int) -> tuple[tuple[int, int], ...]:
        """(start, end) of every tensor segment inside a shard, relative to the shard."""
        shard = self.shard(shard_index)
        return tuple(
            (slot.offset - shard.offset, slot.end - shard.offset)
            for slot in self.slots
            if shard.offset <= slot.offset < shard.end
        )
