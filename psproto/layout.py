"""Model layout: named tensors mapped onto one flat fp32 vector and split into shards.

The layout is a pure function of (names, shapes, number of shards), and so is its cut into
shards (balanced by size, at tensor boundaries where the balance allows, else between rows).
Its hash is sent on every Join so that workers with different models can never mix on one server.
"""

from __future__ import annotations

import bisect
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


# A shard ends at a tensor boundary when one lies within this fraction of an even share of its
# ideal end; otherwise between two rows of the tensor there, so a model whose tensors are large
# against a share (GPT-2's embedding is 31% of it) still gets shards within 1% of each other's size.
BALANCE_TOLERANCE = 0.005

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
                f"{self.num_shards} shards for {len(self.specs)} tensors: use at most one shard per tensor"
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
        """Contiguous shard ranges, each within ``2 * BALANCE_TOLERANCE`` of an even share where the
        tensors' rows allow it, cut at tensor boundaries where that keeps the balance.

        Shard ``i`` ends at the tensor boundary closest to ``(i + 1) * total / S`` while leaving at
        least one tensor end for every later shard; when that boundary is more than
        ``BALANCE_TOLERANCE`` of a share away, and a row boundary of the tensor holding the ideal
        point is nearer, the shard ends there instead (a large embedding is split between shards).
        """
        ends = [slot.end for slot in self.slots]
        total = self.total_length
        share = total / self.num_shards
        cuts = [0]
        for i in range(1, self.num_shards):
            target = total * i / self.num_shards
            previous = cuts[-1]
            # The first tensor end after the previous cut (or the one at it, for the first cut).
            lowest = bisect.bisect_left(ends, previous)
            if previous and lowest < len(ends) and ends[lowest] == previous:
                lowest += 1
            highest = len(ends) - (self.num_shards - i) - 1
            candidates = range(lowest, highest + 1)
            cut = ends[min(candidates, key=lambda k: (abs(ends[k] - target), k))]
            if abs(cut - target) > BALANCE_TOLERANCE * share:
                inside = self._row_cut(ends, target, previous, highest + 1)
                if inside is not None and abs(inside - target) < abs(cut - target):
                    cut = inside
            cuts.append(cut)
        cuts.append(total)
        return tuple(ShardRange(index=i, offset=cuts[i], length=cuts[i + 1] - cuts[i]) for i in range(self.num_shards))

    def _row_cut(self, ends: list[int], target: float, previous: int, last_slot: int) -> int | None:
        """The row boundary nearest ``target`` strictly inside the tensor holding it and after
        ``previous`` (``ends``: every tensor's end); None when that tensor is not one of the first
        ``last_slot + 1`` (a later shard would get no tensor end), has one row, or has no row
        boundary after ``previous``."""
        index = bisect.bisect_right(ends, target)
        if index > last_slot or index >= len(self.slots):
            return None
        slot = self.slots[index]
        if not slot.shape or slot.shape[0] < 2 or not slot.offset < target:
            return None
        row = slot.numel // slot.shape[0]
        rows = min(max(round((target - slot.offset) / row), 1), slot.shape[0] - 1)
        if slot.offset + rows * row <= previous:
            rows = (previous - slot.offset) // row + 1
        return slot.offset + rows * row if rows < slot.shape[0] else None

    def shard(self, index: int) -> ShardRange:
        if not 0 <= index < self.num_shards:
            raise LayoutError(f"shard index {index} is outside 0..{self.num_shards - 1}")
        return self.shards[index]

    def segments(self, shard_index: int) -> tuple[tuple[int, int], ...]:
        """(start, end) of every tensor segment inside a shard, relative to the shard: a tensor
        split between shards is a segment in each (per-tensor rules see the part they hold)."""
        shard = self.shard(shard_index)
        return tuple(
            (max(slot.offset, shard.offset) - shard.offset, min(slot.end, shard.end) - shard.offset)
            for slot in self.slots
            if shard.offset <= slot.offset < shard.end or slot.offset < shard.offset < slot.end
        )
