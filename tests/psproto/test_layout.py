from __future__ import annotations

import itertools

import pytest

from psproto.layout import Layout, LayoutError


def _layout(num_shards: int = 1) -> Layout:
    return Layout.from_named_shapes(
        [("conv.weight", (16, 1, 3, 3)), ("conv.bias", (16,)), ("fc.weight", (10, 64)), ("fc.bias", (10,))],
        num_shards,
    )


def test_slots_are_contiguous_in_order() -> None:
    layout = _layout()
    offsets = [(slot.name, slot.offset, slot.end) for slot in layout.slots]
    assert offsets == [
        ("conv.weight", 0, 144),
        ("conv.bias", 144, 160),
        ("fc.weight", 160, 800),
        ("fc.bias", 800, 810),
    ]
    assert layout.total_length == 810


def test_hash_depends_on_names_shapes_and_shards() -> None:
    base = _layout().hash
    assert base == _layout().hash
    assert _layout(2).hash != base
    renamed = Layout.from_named_shapes(
        [("x", (16, 1, 3, 3)), ("conv.bias", (16,)), ("fc.weight", (10, 64)), ("fc.bias", (10,))]
    )
    assert renamed.hash != base
    reshaped = Layout.from_named_shapes(
        [("conv.weight", (16, 9)), ("conv.bias", (16,)), ("fc.weight", (10, 64)), ("fc.bias", (10,))]
    )
    assert reshaped.hash != base


def test_hash_is_the_documented_canonical_text() -> None:
    import hashlib

    layout = Layout.from_named_shapes([("a", (2, 3)), ("b", (4,))], 1)
    assert layout.hash == hashlib.sha256(b"a:2,3;b:4|1").hexdigest()


@pytest.mark.parametrize("num_shards", [1, 2, 3, 4])
def test_shards_cover_everything_at_tensor_boundaries(num_shards: int) -> None:
    layout = _layout(num_shards)
    shards = layout.shards
    assert shards[0].offset == 0
    assert shards[-1].end == layout.total_length
    boundaries = {slot.end for slot in layout.slots} | {0}
    for left, right in itertools.pairwise(shards):
        assert left.end == right.offset
        assert left.end in boundaries
    assert all(s.length > 0 for s in shards)


def test_shards_balance_by_size() -> None:
    layout = Layout.from_named_shapes([(f"t{i}", (100,)) for i in range(8)], 4)
    assert [s.length for s in layout.shards] == [200, 200, 200, 200]


def test_segments_are_relative_to_the_shard() -> None:
    layout = _layout(2)
    second = layout.shard(1)
    segments = layout.segments(1)
    assert segments[0][0] == 0
    assert segments[-1][1] == second.length


@pytest.mark.parametrize(
    ("specs", "shards", "message"),
    [
        ([], 1, "at least one tensor"),
        ([("a", (2,)), ("a", (3,))], 1, "unique"),
        ([("a", (-1,))], 1, "negative"),
        ([("a", (2,))], 2, "at most one shard per tensor"),
        ([("a", (2,))], 0, "num_shards"),
        ([("a:2;b", (2,))], 1, "contains ':' and ';'"),
        ([("a", (2,)), ("b;c", (2,))], 1, "contains ';'"),
        ([("w", (0, 5))], 1, "no parameters"),
        ([("a", (0,)), ("b", (4,))], 2, r"shard\(s\) 0 of 2 would hold no parameters"),
    ],
)
def test_invalid_layouts_are_refused(specs: list[tuple[str, tuple[int, ...]]], shards: int, message: str) -> None:
    with pytest.raises(LayoutError, match=message):
        Layout.from_named_shapes(specs, shards)


def test_names_cannot_forge_another_layouts_hash_text() -> None:
    """``a:2;b`` of shape [2] would write the same hash text as tensors ``a`` [2] and ``b`` [2]."""
    genuine = Layout.from_named_shapes([("a", (2,)), ("b", (2,))], 1)
    assert genuine.total_length == 4
    with pytest.raises(LayoutError, match="names may not contain any of : ;"):
        Layout.from_named_shapes([("a:2;b", (2,))], 1)


def test_zero_size_tensors_are_allowed_beside_parameters() -> None:
    layout = Layout.from_named_shapes([("empty", (0, 3)), ("w", (4,)), ("b", (2,))], 2)
    assert [shard.length for shard in layout.shards] == [4, 2]


def test_proto_round_trip() -> None:
    layout = _layout(2)
    assert Layout.from_proto(layout.to_proto()) == layout
