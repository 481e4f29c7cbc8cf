"""The chunk size: pushes and Init cut as the worker asks, pulled parameters as the server asks."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psworker.client import ClientConfig, PSClient
from psworker.push_encoding import PushEncoder
from tests.psworker.live import serving

LENGTH = 100_000  # 400,000 bytes of fp32: 7 chunks of 64 KiB, 1 of the default size
SMALL = 64 * 1024
LAYOUT = Layout.from_named_shapes([("w", (LENGTH,))], 1)


def test_a_push_is_cut_into_chunks_of_the_size_asked_for() -> None:
    part = torch.randn(LENGTH)
    for dtype, width in ((codec.FLOAT32, 4), (codec.BFLOAT16, 2)):
        sizes = [len(chunk.data) for chunk in PushEncoder(dtype, chunk_bytes=SMALL).chunks(0, part)]
        assert max(sizes) == SMALL and sum(sizes) == LENGTH * width
    blocks = list(PushEncoder(codec.INT8_BLOCK, chunk_bytes=SMALL).chunks(0, part))
    assert len(blocks) == len(codec.chunk_spans(LENGTH, codec.INT8_BLOCK, SMALL)) > 1
    assert all(len(chunk.data) + len(chunk.scales) <= SMALL for chunk in blocks)


@pytest.mark.parametrize("chunk_bytes", [1024, 64 * 1024 * 1024])
def test_a_chunk_size_out_of_bounds_is_refused_with_what_to_fix(chunk_bytes: int) -> None:
    with pytest.raises(ValueError, match="a chunk of"):
        PSClient(["127.0.0.1:9"], LAYOUT, config=ClientConfig(chunk_bytes=chunk_bytes))


@pytest.fixture
def small_chunks() -> Iterator[str]:
    with serving(Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "1.0"}), chunk_bytes=SMALL))) as address:
        yield address


def test_a_step_in_small_chunks_both_ways_moves_every_element(small_chunks: str) -> None:
    initial = torch.randn(LENGTH)
    gradient = torch.randn(LENGTH)
    with PSClient([small_chunks], LAYOUT, name="small", config=ClientConfig(chunk_bytes=SMALL)) as client:
        client.init(initial)
        pulled = torch.empty(LENGTH)
        client.push(gradient, pull_into=pulled)
        torch.testing.assert_close(pulled, initial - gradient)
        # The server cut the parameters into its own chunk size: one message per 64 KiB.
        with grpc.insecure_channel(small_chunks) as channel:
            request = ps_pb2.PullRequest(worker_id=client.sessions[0].worker_id)
            replies = list(ps_pb2_grpc.ParameterServerStub(channel).Pull(request, timeout=10))
        assert len(replies) == len(codec.chunk_spans(LENGTH, codec.FLOAT32, SMALL)) == 7
        assert max(len(reply.chunk.data) for reply in replies) == SMALL
