from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psproto.layout import BALANCE_TOLERANCE, Layout, LayoutError


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


def _at_a_tensor_or_row_boundary(layout: Layout, cut: int) -> bool:
    """Whether ``cut`` is a tensor's end, or lies between two rows (first-dimension entries) of one."""
    for slot in layout.slots:
        if cut == slot.end:
            return True
        if slot.offset < cut < slot.end:
            return (cut - slot.offset) % (slot.numel // slot.shape[0]) == 0
    return cut == 0


@pytest.mark.parametrize("num_shards", [1, 2, 3, 4])
def test_shards_cover_everything_cut_at_tensor_or_row_boundaries(num_shards: int) -> None:
    layout = _layout(num_shards)
    shards = layout.shards
    assert shards[0].offset == 0
    assert shards[-1].end == layout.total_length
    for left, right in itertools.pairwise(shards):
        assert left.end == right.offset
        assert _at_a_tensor_or_row_boundary(layout, left.end)
    assert all(s.length > 0 for s in shards)


def test_shards_balance_by_size() -> None:
    layout = Layout.from_named_shapes([(f"t{i}", (100,)) for i in range(8)], 4)
    assert [s.length for s in layout.shards] == [200, 200, 200, 200]


def test_a_tensor_boundary_near_the_even_cut_is_kept_and_one_further_away_is_not() -> None:
    # 1,000 + 1,003 elements: the boundary is 0.15% of a share from the middle, within the tolerance.
    layout = Layout.from_named_shapes([("a", (1000,)), ("b", (1003,))], 2)
    assert [s.length for s in layout.shards] == [1000, 1003]
    # 1,000 + 1,030: 1.5% away, beyond it; the cut moves into the tensor holding the middle.
    layout = Layout.from_named_shapes([("a", (1000,)), ("b", (1030,))], 2)
    assert [s.length for s in layout.shards] == [1015, 1015]
    assert 1.5 / 1001.5 < BALANCE_TOLERANCE < 15 / 1015


@pytest.mark.parametrize("num_shards", [2, 4, 8])
def test_a_tensor_larger_than_a_share_is_split_between_rows_to_balance(num_shards: int) -> None:
    # An embedding of 38% of the model, as GPT-2's is; whole tensors alone could not balance it.
    specs = [("embed", (4000, 16)), *((f"layer{i}.w", (96, 16)) for i in range(60)), ("norm", (16,))]
    layout = Layout.from_named_shapes(specs, num_shards)
    lengths = [s.length for s in layout.shards]
    assert max(lengths) / min(lengths) <= 1.01
    for cut in (s.offset for s in layout.shards[1:]):
        assert _at_a_tensor_or_row_boundary(layout, cut)
    # The embedding is split exactly when it is larger than a share (at 4 and 8 shards).
    split = any(s.offset < layout.slots[0].end for s in layout.shards[1:])
    assert split == (layout.slots[0].numel > layout.total_length / num_shards)


_SHAPES = st.lists(st.lists(st.integers(0, 6), max_size=3).map(tuple), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(shapes=_SHAPES, num_shards=st.integers(1, 8))
def test_any_layout_is_cut_into_non_empty_tiles_or_refused_with_a_layout_error(
    shapes: list[tuple[int, ...]], num_shards: int
) -> None:
    try:
        layout = Layout.from_named_shapes([(f"t{i}", shape) for i, shape in enumerate(shapes)], num_shards)
    except LayoutError:
        return
    shards = layout.shards
    assert shards[0].offset == 0 and shards[-1].end == layout.total_length
    for index, (left, right) in enumerate(itertools.pairwise(shards)):
        assert left.end == right.offset and _at_a_tensor_or_row_boundary(layout, left.end)
        assert sum(end - start for start, end in layout.segments(index)) == left.length
    assert all(s.length > 0 for s in shards)


def test_a_split_tensor_is_a_segment_in_each_shard_that_holds_part_of_it() -> None:
    layout = Layout.from_named_shapes([("embed", (100, 4)), ("w", (4, 4)), ("b", (4,))], 2)
    first = layout.shards[0]
    assert first.end == 208  # rows of 4; the even cut is 210
    assert layout.segments(0) == ((0, 208),)
    assert layout.segments(1) == ((0, 192), (192, 208), (208, 212))
    for index, shard in enumerate(layout.shards):
        assert sum(end - start for start, end in layout.segments(index)) == shard.length


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
        # A scalar has no rows to split between shards.
        ([("a", (0,)), ("b", ())], 2, r"shard\(s\) 0 of 2 would hold no parameters"),
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
    assert [shard.length for shard in layout.shards] == [3, 3]
    assert layout.segments(0) == ((0, 0), (0, 3))
    # Before a tensor with rows, a zero-size tensor leaves no shard empty: the rows are split.
    layout = Layout.from_named_shapes([("empty", (0,)), ("w", (4,))], 2)
    assert [shard.length for shard in layout.shards] == [2, 2]


def test_proto_round_trip() -> None:
    layout = _layout(2)
    assert Layout.from_proto(layout.to_proto()) == layout
