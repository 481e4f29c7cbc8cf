"""The worker's bulk data path: chunks made and taken in on the thread that moves them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from psproto import codec, wire
from psproto.v1 import ps_pb2
from psworker.service import ServerMismatchError
from psworker.transfer import (
    fits_one_message,
    push_pull_reply,
    push_requests,
    receive_params,
    unary_forms,
    unary_push_request,
)


@pytest.mark.usefixtures("two_threads")
def test_pulled_chunks_are_taken_in_with_one_intra_op_thread() -> None:
    values = torch.arange(10, dtype=torch.float32)
    threads_seen: list[int] = []

    def replies() -> Iterator[wire.PulledChunk]:
        for payload in codec.payloads(values, codec.BFLOAT16, chunk_bytes=8):
            threads_seen.append(torch.get_num_threads())
            chunk = ps_pb2.Chunk()
            payload.fill(chunk)
            yield wire.PulledChunk(clock=7, total_length=10, chunk=chunk)  # type: ignore[arg-type]

    out = torch.zeros(10)
    assert receive_params(replies(), out) == 7
    assert torch.equal(out, values) and threads_seen == [1] * 3
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_pushed_chunks_are_made_with_one_intra_op_thread() -> None:
    threads_seen: list[int] = []

    def chunks() -> Iterator[codec.ChunkPayload]:
        for payload in codec.payloads(torch.ones(6), codec.BFLOAT16, chunk_bytes=4):
            threads_seen.append(torch.get_num_threads())
            yield payload

    requests = list(push_requests(ps_pb2.PushHeader(push_id=1), chunks()))
    assert len(requests) == 4 and threads_seen == [1] * 3


def _pulled(values: torch.Tensor, clock: int) -> Iterator[wire.PulledChunk]:
    for payload in codec.payloads(values, codec.FLOAT32, chunk_bytes=16):
        chunk = ps_pb2.Chunk()
        payload.fill(chunk)
        yield wire.PulledChunk(clock=clock, total_length=len(values), chunk=chunk)  # type: ignore[arg-type]


def test_a_push_pull_reply_is_its_acknowledgement_then_the_parameters() -> None:
    values = torch.arange(10, dtype=torch.float32)
    ack = ps_pb2.PushResponse(clock=5, staleness=2)
    out = torch.zeros(10)
    received, clock = push_pull_reply([ack, *_pulled(values, 5)], out)
    assert received == ack and clock == 5
    assert torch.equal(out, values)


def test_parameters_before_the_acknowledgement_are_refused_and_nothing_is_written() -> None:
    out = torch.zeros(10)
    with pytest.raises(ServerMismatchError, match="before its acknowledgement"):
        push_pull_reply(_pulled(torch.ones(10), 3), out)
    assert torch.equal(out, torch.zeros(10))


def test_a_push_pull_reply_without_any_message_is_a_server_mismatch() -> None:
    out = torch.zeros(10)
    with pytest.raises(ServerMismatchError, match="ended without its acknowledgement"):
        push_pull_reply([], out)
    assert torch.equal(out, torch.zeros(10))


def test_a_unary_request_carries_the_header_and_the_chunks_as_the_generated_code_writes_them() -> None:
    header = ps_pb2.PushHeader(worker_id=1, push_id=2, base_clock=3, pull_dtype=ps_pb2.DTYPE_FLOAT16)
    values = torch.randn(3000)
    chunks = list(codec.payloads(values, codec.INT8_BLOCK, chunk_bytes=codec.DEFAULT_CHUNK_BYTES))
    request = ps_pb2.PushPullUnaryRequest.FromString(unary_push_request(header, chunks))
    assert request.header == header
    assert [(c.offset, c.dtype, c.data, c.scales) for c in request.chunks] == [
        (p.offset, p.dtype, bytes(p.data), bytes(p.scales)) for p in chunks
    ]


@pytest.mark.parametrize(
    ("length", "push", "pull", "fits"),
    [
        (100, codec.FLOAT32, codec.BFLOAT16, True),
        (256, codec.FLOAT32, codec.FLOAT32, True),  # 1,024 bytes each way: exactly one chunk
        (257, codec.FLOAT32, codec.FLOAT32, False),  # a second chunk of one element
        (400, codec.INT8_BLOCK, codec.BFLOAT16, True),
        (600, codec.INT8_BLOCK, codec.BFLOAT16, False),  # the push is one chunk, the reply is not
        (0, codec.FLOAT32, codec.FLOAT32, True),
    ],
)
def test_a_push_pull_goes_as_one_call_when_each_way_is_one_chunk(length: int, push: int, pull: int, fits: bool) -> None:
    assert fits_one_message(length, push, pull, chunk_bytes=1024) is fits


def test_a_push_goes_as_one_call_when_it_is_one_chunk_whatever_its_reply() -> None:
    # 600 elements: one 8-bit chunk, but 1,200 bytes of bf16 back; in fp32, 600 and 257 elements are two chunks.
    lengths = [100, 600, 257]
    pushes, push_pulls = unary_forms(lengths, codec.INT8_BLOCK, codec.BFLOAT16, chunk_bytes=1024)
    assert pushes == [True, True, True] and push_pulls == [True, False, True]
    pushes, push_pulls = unary_forms(lengths, codec.FLOAT32, codec.FLOAT32, chunk_bytes=1024)
    assert pushes == push_pulls == [True, False, False]
