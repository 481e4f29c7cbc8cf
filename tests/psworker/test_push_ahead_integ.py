"""Pushes made ahead of their sending (``build_pushes_ahead``) or encoded on several threads
(``encode_threads``): the same bytes, the same residuals."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from psproto import ahead as ahead_module
from psproto import blocks
from psproto.ahead import Ahead
from psproto.layout import Layout
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psworker.client import PSClient
from tests.psworker.live import serving

# Two shards of many small chunks each, so a push's stream is many messages long.
LAYOUT = Layout.from_named_shapes([("w", (600, 500)), ("b", (77,))], 2)
CHUNK_BYTES = 64 * 1024  # the smallest a worker may use


def _train(
    ahead: bool, push_dtype: str, encode_threads: int = 1
) -> tuple[list[torch.Tensor], torch.Tensor, list[torch.Tensor | None]]:
    """One worker's PushPulls and plain pushes; what came back, the shards' parameters and the residuals."""
    shards = [
        Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.1"}), shard_index=i, num_shards=2, chunk_bytes=CHUNK_BYTES))
        for i in range(2)
    ]
    generator = torch.Generator().manual_seed(1)
    got = []
    with serving(shards[0]) as first, serving(shards[1]) as second, PSClient(
        [first, second], LAYOUT, name="w", push_dtype=push_dtype, pull_dtype="fp32",
        chunk_bytes=CHUNK_BYTES, build_pushes_ahead=ahead, encode_threads=encode_threads,
    ) as client:  # fmt: skip
        # Every Push and PushPull as streams, the form made ahead.
        client.unary_pushes, client.unary_push_pulls = [False, False], [False, False]
        client.init(torch.randn(LAYOUT.total_length, generator=generator))
        client.pull(torch.empty(LAYOUT.total_length))
        for step in range(4):
            out = torch.empty(LAYOUT.total_length)
            gradient = torch.randn(LAYOUT.total_length, generator=generator)
            if step % 2:
                client.push(gradient)
                client.pull(out)
            else:
                client.push(gradient, pull_into=out)
            got.append(out)
        residuals = [client.push_encoder.residual(i) for i in range(2)]
    return got, torch.cat([shard.params for shard in shards]), residuals


def test_pushes_made_ahead_send_what_pushes_made_in_turn_send(monkeypatch: pytest.MonkeyPatch) -> None:
    made_ahead: list[int] = []

    class CountedAhead(Ahead[object]):
        def close(self, wait: bool = True) -> None:
            made_ahead.append(1)
            super().close(wait)

    monkeypatch.setattr(ahead_module, "Ahead", CountedAhead)
    for push_dtype in ("int8", "fp32"):
        got_in_turn, params_in_turn, residuals_in_turn = _train(False, push_dtype)
        assert made_ahead == []
        got_ahead, params_ahead, residuals_ahead = _train(True, push_dtype)
        assert len(made_ahead) == 8  # 4 pushes to each of 2 shards
        made_ahead.clear()
        for in_turn, ahead in zip(got_in_turn, got_ahead, strict=True):
            assert torch.equal(in_turn, ahead)
        assert torch.equal(params_in_turn, params_ahead)
        for residual_in_turn, residual_ahead in zip(residuals_in_turn, residuals_ahead, strict=True):
            if push_dtype == "int8":
                assert residual_in_turn is not None and residual_ahead is not None
                assert torch.equal(residual_in_turn, residual_ahead) and residual_ahead.abs().sum() > 0
            else:
                assert residual_in_turn is residual_ahead is None


@pytest.mark.parametrize("ahead", [False, True])
def test_8_bit_pushes_encoded_on_several_threads_send_what_one_thread_sends(
    ahead: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded_on: set[str] = set()
    encode = blocks.encode_with_feedback

    def noted(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        encoded_on.add(threading.current_thread().name.split("_")[0])
        return encode(*args, **kwargs)

    monkeypatch.setattr(blocks, "encode_with_feedback", noted)
    got_one, params_one, residuals_one = _train(False, "int8")
    assert "push-encoder" not in encoded_on
    got_many, params_many, residuals_many = _train(ahead, "int8", encode_threads=3)
    assert "push-encoder" in encoded_on
    assert all(torch.equal(one, many) for one, many in zip(got_one, got_many, strict=True))
    assert torch.equal(params_one, params_many)
    for one, many in zip(residuals_one, residuals_many, strict=True):
        assert one is not None and many is not None and torch.equal(one, many)
