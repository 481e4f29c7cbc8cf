"""PushEncoder: the chunks a push sends, and the 8-bit codec's error feedback on the worker."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch

from psproto import blocks, codec
from psproto.blocks import BLOCK
from psproto.layout import Layout
from psworker.push_encoding import PushEncoder, wire_dtypes


def _decoded(chunks: Iterable[codec.ChunkPayload], length: int) -> torch.Tensor:
    out = torch.empty(length)
    assembler = codec.Assembler(out, accept_blocks=True)
    for chunk in chunks:
        assembler.add(chunk)
    assembler.finish()
    return out


def test_the_decoded_pushes_trail_the_true_ones_by_the_residual_alone() -> None:
    length = 2 * BLOCK + 100
    encoder = PushEncoder(codec.INT8_BLOCK)
    generator = torch.Generator().manual_seed(3)
    true_sum = torch.zeros(length, dtype=torch.float64)
    sent_sum = torch.zeros(length, dtype=torch.float64)
    for _ in range(30):
        push = torch.randn(length, generator=generator) * torch.rand(1, generator=generator)
        chunks = list(encoder.chunks(0, push))
        true_sum += push.double()
        sent_sum += _decoded(chunks, length).double()
        residual = encoder.residual(0)
        assert residual is not None
        # |Σp − Σx̂| = |e|, and e stays within half a step of the last push's blocks.
        torch.testing.assert_close(true_sum - sent_sum, residual.double(), atol=1e-4, rtol=0)
        steps = torch.cat([torch.frombuffer(bytearray(c.scales), dtype=torch.float32) for c in chunks])
        bound = steps.repeat_interleave(BLOCK)[:length] / 2 * (1 + 2**-12)
        assert bool((residual.abs() <= bound).all())


def test_without_error_feedback_small_values_are_lost_for_good() -> None:
    # One large value per block makes the step 1/127: values of 0.003 round to 0 at every push.
    push = torch.full((BLOCK,), 0.003)
    push[0] = 1.0
    sums = {}
    for feedback in (True, False):
        encoder = PushEncoder(codec.INT8_BLOCK, error_feedback=feedback)
        sent = torch.zeros(BLOCK)
        for _ in range(100):
            sent += _decoded(encoder.chunks(0, push), BLOCK)
        sums[feedback] = sent
        assert (encoder.residual(0) is None) is not feedback
    true = push * 100
    assert float((true - sums[False]).abs().max()) > 0.29
    assert float((true - sums[True]).abs().max()) <= 1 / 254 + 1e-5


def test_each_shard_keeps_its_own_residual_until_it_is_reset() -> None:
    encoder = PushEncoder(codec.INT8_BLOCK)
    push = torch.tensor([1.0, 0.003, -0.002])
    list(encoder.chunks(0, push))
    list(encoder.chunks(1, push * 2))
    first, second = encoder.residual(0), encoder.residual(1)
    assert first is not None and second is not None and not torch.equal(first, second)
    encoder.reset(0)
    assert encoder.residual(0) is None and encoder.residual(1) is second


def test_a_push_with_non_finite_values_leaves_the_residual_as_it_was() -> None:
    encoder = PushEncoder(codec.INT8_BLOCK)
    list(encoder.chunks(0, torch.tensor([1.0, 0.003])))
    before = encoder.residual(0)
    assert before is not None
    kept = before.clone()
    (chunk,) = encoder.chunks(0, torch.tensor([float("nan"), 0.003]))
    assert not torch.isfinite(torch.frombuffer(bytearray(chunk.scales), dtype=torch.float32)).all()
    assert torch.equal(encoder.residual(0), kept)  # type: ignore[arg-type]


def test_a_push_of_many_chunks_is_encoded_as_it_is_sent_with_the_bytes_of_a_whole_encode() -> None:
    length = 3 * codec.chunk_spans(10**7, codec.INT8_BLOCK)[0].stop + 5  # three full chunks and a short one
    generator = torch.Generator().manual_seed(5)
    pushes = [torch.randn(length, generator=generator) for _ in range(2)]
    encoder = PushEncoder(codec.INT8_BLOCK)
    list(encoder.chunks(0, pushes[0]))
    residual = encoder.residual(0)
    assert residual is not None
    values, scales, updated = blocks.encode_with_feedback(pushes[1], residual)
    lazy = encoder.chunks(0, pushes[1])
    iterator = iter(lazy)
    sent = [next(iterator) for _ in range(3)]
    # Three of four chunks out: the residual has not moved yet, and a retry resends the same three.
    assert encoder.residual(0) is residual
    again = list(lazy)
    assert again[:3] == sent and len(again) == 4
    assert torch.equal(encoder.residual(0), updated)  # type: ignore[arg-type]
    assert torch.equal(torch.cat([torch.frombuffer(bytearray(c.data), dtype=torch.int8) for c in again]), values)
    assert torch.equal(torch.cat([torch.frombuffer(bytearray(c.scales), dtype=torch.float32) for c in again]), scales)


def test_two_residual_buffers_alternate_from_push_to_push() -> None:
    encoder = PushEncoder(codec.INT8_BLOCK)
    generator = torch.Generator().manual_seed(7)
    pushes = [torch.randn(BLOCK + 3, generator=generator) for _ in range(4)]
    buffers = []
    for push in pushes:
        residual = encoder.residual(0)
        expected = None if residual is None else blocks.encode_with_feedback(push, residual)[2]
        list(encoder.chunks(0, push))
        current = encoder.residual(0)
        assert current is not None and current is not residual
        if expected is not None:
            assert torch.equal(current, expected)  # written over the spare, the bits are the same
        buffers.append(current.data_ptr())
    assert buffers[2] == buffers[0] and buffers[3] == buffers[1] and buffers[0] != buffers[1]


def test_a_push_given_up_before_its_first_chunk_leaves_the_spare_buffer_to_the_next() -> None:
    encoder = PushEncoder(codec.INT8_BLOCK)
    pushes = [torch.full((BLOCK + 3,), value) for value in (0.1, 0.2, 0.3)]
    list(encoder.chunks(0, pushes[0]))
    first = encoder.residual(0)
    list(encoder.chunks(0, pushes[1]))  # the first residual is the spare now
    encoder.chunks(0, pushes[2])  # made, never sent (its call failed before asking for a chunk)
    list(encoder.chunks(0, pushes[2]))
    current = encoder.residual(0)
    assert first is not None and current is not None and current.data_ptr() == first.data_ptr()


def test_a_push_begun_before_a_reset_resends_its_bytes_but_moves_no_residual() -> None:
    encoder = PushEncoder(codec.INT8_BLOCK)
    length = 2 * codec.chunk_spans(10**7, codec.INT8_BLOCK)[0].stop
    list(encoder.chunks(0, torch.full((length,), 0.3)))
    push = encoder.chunks(0, torch.full((length,), 0.2))
    first = next(iter(push))
    encoder.reset(0)  # the worker joined the shard again mid-push
    again = list(push)
    assert again[0] is first and len(again) == 2
    assert encoder.residual(0) is None


def test_a_push_sent_only_in_part_leaves_the_residual_as_it_was() -> None:
    encoder = PushEncoder(codec.INT8_BLOCK)
    length = 2 * codec.chunk_spans(10**7, codec.INT8_BLOCK)[0].stop
    next(iter(encoder.chunks(0, torch.ones(length))))
    assert encoder.residual(0) is None


def test_float_dtypes_are_encoded_lazily_and_keep_no_residual() -> None:
    encoder = PushEncoder(codec.BFLOAT16)
    chunks = encoder.chunks(0, torch.ones(10))
    assert not isinstance(chunks, list)
    assert torch.equal(_decoded(chunks, 10), torch.ones(10))
    assert encoder.residual(0) is None and not encoder.error_feedback


def test_one_push_encodes_each_shard_once_for_all_its_attempts() -> None:
    # One row each: shards cut between the tensors, so the two shards differ in length.
    layout = Layout.from_named_shapes([("a", (1, 3)), ("b", (1, 5))], 2)
    encoder = PushEncoder(codec.INT8_BLOCK)
    push = encoder.one_push(torch.tensor([1.0, 0.003, -0.002, 0.5, 0.25, 0.001, 0.0, -1.0]))
    first = [list(push.chunks(shard)) for shard in layout.shards]
    again = [list(push.chunks(shard)) for shard in layout.shards]
    assert first == again and [len(c[0].data) for c in first] == [3, 5]
    moved = encoder.residual(0)
    assert moved is not None
    list(push.chunks(layout.shards[0]))
    assert torch.equal(encoder.residual(0), moved)  # type: ignore[arg-type]


def test_dtype_names_resolve_and_int8_pulls_are_refused() -> None:
    assert wire_dtypes("bf16", None, None) == (codec.BFLOAT16, codec.BFLOAT16)
    assert wire_dtypes("fp32", "int8", "bf16") == (codec.INT8_BLOCK, codec.BFLOAT16)
    with pytest.raises(ValueError, match="for pushes only"):
        wire_dtypes("fp32", "int8", "int8")
    with pytest.raises(ValueError, match="push dtype 'int4'"):
        wire_dtypes("fp32", "int4", None)
