"""The handlers move chunks with one intra-op thread and apply with the shard's threads, over real gRPC.

torch's intra-op pool woken for every chunk-sized copy costs more than the copy (psproto.inline_ops);
the rule's apply, one operation over the whole shard, keeps the threads ``--torch-threads`` gave it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.rpc.server import start_server

LAYOUT = Layout.from_named_shapes([("w", (64,))])


def _recording(seen: list[int], function: Callable[..., Any]) -> Callable[..., Any]:
    def recorded(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.get_num_threads())
        return function(*args, **kwargs)

    return recorded


@pytest.mark.usefixtures("two_threads")
def test_chunks_move_on_one_thread_and_the_apply_keeps_two(monkeypatch: pytest.MonkeyPatch) -> None:
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.1"}), chunk_bytes=64))
    decoded: list[int] = []
    applied: list[int] = []
    replied: list[int] = []
    # Encoded before the recording starts: only the server's reply messages are counted.
    init_chunks = list(codec.encode(torch.zeros(64), chunk_bytes=64))
    push_chunks = list(codec.encode(torch.ones(64), chunk_bytes=64))
    monkeypatch.setattr(codec.Assembler, "add", _recording(decoded, codec.Assembler.add))
    monkeypatch.setattr(codec.Chunker, "payload", _recording(replied, codec.Chunker.payload))
    running = start_server(shard, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            joined = stub.Join(ps_pb2.JoinRequest(worker_name="w", layout=LAYOUT.to_proto(), layout_hash=LAYOUT.hash))
            worker = int(joined.worker_id)
            init = ps_pb2.InitHeader(worker_id=worker, layout_hash=LAYOUT.hash)
            chunks = (ps_pb2.InitRequest(chunk=c) for c in init_chunks)
            stub.Init(iter([ps_pb2.InitRequest(header=init), *chunks]), timeout=10)
            # The model exists once a worker's layout is taken: its apply is the rule's, on the server's pool.
            model = shard._model
            monkeypatch.setattr(model, "apply", _recording(applied, model.apply))

            def pushed() -> Iterator[ps_pb2.PushRequest]:
                header = ps_pb2.PushHeader(
                    worker_id=worker, push_id=1, layout_hash=LAYOUT.hash, kind=ps_pb2.PAYLOAD_KIND_GRADIENT
                )
                yield ps_pb2.PushRequest(header=header)
                yield from (ps_pb2.PushRequest(chunk=c) for c in push_chunks)

            replies = list(stub.PushPull(pushed(), timeout=10))
    finally:
        running.stop(0)
    assert replies[0].ack.clock == 1 and len(replies) == 1 + 4
    assert decoded == [1] * 8  # four Init chunks, four pushed ones
    assert replied == [1] * 4
    assert applied == [2]
