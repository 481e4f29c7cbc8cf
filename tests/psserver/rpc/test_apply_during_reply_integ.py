"""``--apply-during-reply``, ``--build-replies-ahead`` and receiving ahead over real gRPC: the same parameters as
applying whole and sending as built, and no buffer left behind."""

from __future__ import annotations

import time

import grpc
import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core import span_apply
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psworker.client import PSClient
from tests.psworker.live import serving

LAYOUT = Layout.from_named_shapes([("w", (40, 25)), ("b", (37,))], 2)


@pytest.fixture(autouse=True)
def small_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans of 100 elements, so a reply's messages and the spans do not line up."""
    monkeypatch.setattr(span_apply, "SPAN_ELEMENTS", 100)


def _shards(during_reply: bool, ahead: bool) -> list[Shard]:
    # Replies of 128 elements: many messages per shard, none lined up with the 100-element spans.
    rule = RuleSpec.parse("sa", {"lr": "0.2"})
    config = ShardConfig(
        rule, chunk_bytes=512, apply_during_reply=during_reply, build_replies_ahead=ahead, receive_pushes_ahead=ahead
    )
    return [Shard(ShardConfig(**{**config.__dict__, "shard_index": i, "num_shards": 2})) for i in range(2)]


def _train(during_reply: bool, ahead: bool = False, unary: bool = True) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Two workers taking turns through PushPull for a few steps (as one PushPullUnary call each, or
    as streams); what each got back, and the shards' parameters."""
    shards = _shards(during_reply, ahead)
    generator = torch.Generator().manual_seed(0)
    got = []
    with serving(shards[0]) as first, serving(shards[1]) as second:
        addresses = [first, second]
        clients = [
            PSClient(
                addresses,
                LAYOUT,
                name=f"w{i}",
                wire_dtype="fp32",
                build_pushes_ahead=ahead,
                receive_replies_ahead=ahead,
            )
            for i in range(2)
        ]
        try:
            for client in clients:
                assert client.unary_push_pulls == [True, True]  # the pushes fit one chunk of the client's
                client.unary_push_pulls = [unary, unary]
            clients[0].init(torch.randn(LAYOUT.total_length, generator=generator))
            for client in clients:
                client.pull(torch.empty(LAYOUT.total_length))
            for _ in range(3):
                for client in clients:
                    out = torch.empty(LAYOUT.total_length)
                    client.push(torch.randn(LAYOUT.total_length, generator=generator), pull_into=out)
                    got.append(out)
        finally:
            for client in clients:
                client.close()
    for shard in shards:
        assert shard._receiver.buffers.in_use == 0
    return got, torch.cat([shard.params for shard in shards])


@pytest.mark.parametrize("unary", [True, False], ids=["one-call", "streams"])
@pytest.mark.parametrize(("during_reply", "ahead"), [(True, False), (False, True), (True, True)])
def test_pushpull_gives_the_same_parameters_applied_during_the_reply_or_built_ahead(
    during_reply: bool, ahead: bool, unary: bool
) -> None:
    got_whole, params_whole = _train(False, unary=unary)
    got_during, params_during = _train(during_reply, ahead, unary)
    assert len(got_whole) == len(got_during) == 6
    for whole, during in zip(got_whole, got_during, strict=True):
        assert torch.equal(whole, during)
    assert torch.equal(params_whole, params_during)


@pytest.mark.parametrize("ahead", [False, True])
def test_a_reply_the_client_cancels_still_has_its_whole_update_applied(ahead: bool) -> None:
    # 4 MB of parameters: more than the client's receive window, so the server is still building
    # the reply (and applying the update span by span) when the client walks away.
    length = 1_000_000
    rule = RuleSpec.parse("asgd", {"lr": "1.0"})
    config = ShardConfig(rule, chunk_bytes=64 * 1024, apply_during_reply=True, build_replies_ahead=ahead)
    shard = Shard(config)
    layout = Layout.from_named_shapes([("w", (length,))], 1)
    with serving(shard) as address, grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        joined = stub.Join(ps_pb2.JoinRequest(worker_name="w", layout=layout.to_proto(), layout_hash=layout.hash))
        worker = joined.worker_id
        init = ps_pb2.InitHeader(worker_id=worker, layout_hash=layout.hash)
        chunks = [ps_pb2.InitRequest(chunk=c) for c in codec.encode(torch.zeros(length))]
        stub.Init(iter([ps_pb2.InitRequest(header=init), *chunks]), timeout=30)
        header = ps_pb2.PushHeader(
            worker_id=worker, push_id=1, layout_hash=layout.hash, kind=ps_pb2.PAYLOAD_KIND_GRADIENT, pull_dtype=1
        )
        pushed = [ps_pb2.PushRequest(chunk=c) for c in codec.encode(torch.ones(length))]
        call = stub.PushPull(iter([ps_pb2.PushRequest(header=header), *pushed]), timeout=30)
        assert next(call).ack.clock == 1  # the acknowledgement; the parameters are never read
        call.cancel()
        deadline = time.monotonic() + 20
        while shard._receiver.buffers.in_use and time.monotonic() < deadline:
            time.sleep(0.01)
        assert shard._receiver.buffers.in_use == 0
        assert torch.equal(shard.params, -torch.ones(length))
