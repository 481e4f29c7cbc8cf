"""The worker sends a small shard's PushPull as one PushPullUnary call, and its Push as one PushUnary
call: the same parameters to the bit as streams, and streams again where the server does not take the
call or its reply would not fit in one message."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import grpc
import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.reasons import UNARY_REPLY_LIMIT, Reason
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.rpc.server import ServerLimits
from psserver.rpc.status_codes import refusal
from psworker.channels import open_channel
from psworker.client import ClientConfig, PSClient
from psworker.transfer import refuses_unary
from tests.psworker.live import serving
from tests.psworker.refusals import BareStatus, FakeRpcError

SHAPES = [("w", (30, 40)), ("b", (40,))]
LAYOUT = Layout.from_named_shapes(SHAPES)


class _Methods(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """Notes the method of every unary, client-streaming and bidirectional call a client makes."""

    def __init__(self) -> None:
        self.called: list[str] = []

    def _note(self, details: grpc.ClientCallDetails) -> None:
        self.called.append(details.method.rsplit("/", 1)[-1])

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        self._note(details)
        return continuation(details, request)

    def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, requests: Any
    ) -> Any:
        self._note(details)
        return continuation(details, requests)

    intercept_stream_unary = intercept_stream_stream


class _WithoutUnary(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """A server as one without ``method`` (PushPullUnary unless told) answers it: UNIMPLEMENTED."""

    def __init__(self, method: str = "PushPullUnary") -> None:
        self.method = method

    async def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        return None if details.method.endswith(f"/{self.method}") else await continuation(details)


def _as_the_client_opens(client: PSClient, address: str) -> grpc.Channel:
    """A channel to ``address`` as ``client`` opens its own (for a test that wraps it)."""
    return open_channel(address, None, client.keepalive_seconds, client._single_threaded_pulls)


def _shard(num_shards: int = 1, index: int = 0, chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES) -> Shard:
    rule = RuleSpec.parse("momentum", {"lr": "0.1"})
    return Shard(ShardConfig(rule, shard_index=index, num_shards=num_shards, chunk_bytes=chunk_bytes))


def _watched(monkeypatch: pytest.MonkeyPatch) -> _Methods:
    """The methods every PSClient made from now on calls."""
    methods = _Methods()
    monkeypatch.setattr(
        PSClient,
        "_channel",
        lambda self, address: grpc.intercept_channel(_as_the_client_opens(self, address), methods),
    )
    return methods


def _train(
    addresses: list[str],
    unary: bool,
    monkeypatch: pytest.MonkeyPatch,
    layout: Layout = LAYOUT,
    init: bool = True,
    **options: Any,
) -> tuple[list[torch.Tensor], list[str], list[bool]]:
    """Four PushPulls of seeded gradients (after an Init, with ``init``); the parameters each brought
    back, the methods called, and whether each shard still takes PushPullUnary at the end."""
    methods = _watched(monkeypatch)
    generator = torch.Generator().manual_seed(3)
    got = []
    with PSClient(addresses, layout, name="w", config=ClientConfig(**options)) as client:
        if init:
            client.init(torch.randn(layout.total_length, generator=generator))
        client.unary_push_pulls = [unary and fits for fits in client.unary_push_pulls]
        for _ in range(4):
            out = torch.empty(layout.total_length)
            client.push(torch.randn(layout.total_length, generator=generator), pull_into=out)
            got.append(out)
        return got, methods.called, client.unary_push_pulls


@contextmanager
def _serving(shards: list[Shard], **options: Any) -> Iterator[list[str]]:
    with ExitStack() as stack:
        yield [stack.enter_context(serving(shard, **options)) for shard in shards]


@pytest.mark.parametrize(
    "options",
    [{}, {"wire_dtype": "bf16"}, {"push_dtype": "int8", "pull_dtype": "fp16"}],
    ids=["fp32", "bf16", "int8-fp16"],
)
def test_one_call_each_way_brings_back_what_two_streams_bring(
    options: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = {}
    for unary in (True, False):
        shards = [_shard(2, 0), _shard(2, 1)]
        with _serving(shards) as addresses:
            got, called, still = _train(addresses, unary, monkeypatch, Layout.from_named_shapes(SHAPES, 2), **options)
        results[unary] = got, torch.cat([s.params for s in shards]), [s.applied_pushes for s in shards]
        assert called.count("PushPullUnary" if unary else "PushPull") == 8  # 4 pushes to each of 2 shards
        assert called.count("PushPull" if unary else "PushPullUnary") == 0 and still == [unary, unary]
    (got_unary, params_unary, applied_unary), (got_streams, params_streams, applied_streams) = (
        results[True],
        results[False],
    )
    assert all(torch.equal(a, b) for a, b in zip(got_unary, got_streams, strict=True))
    assert torch.equal(params_unary, params_streams) and applied_unary == applied_streams == [4, 4]


def test_a_shard_larger_than_a_chunk_goes_as_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout.from_named_shapes([("w", (20_000,))])  # 80,000 bytes in fp32
    for chunk_bytes, unary in ((codec.DEFAULT_CHUNK_BYTES, True), (64 * 1024, False)):
        with _serving([_shard()]) as addresses:
            _, called, still = _train(addresses, True, monkeypatch, layout, chunk_bytes=chunk_bytes)
        assert still == [unary] and called.count("PushPullUnary" if unary else "PushPull") == 4, chunk_bytes


def test_a_server_without_the_call_gets_streams_from_then_on(monkeypatch: pytest.MonkeyPatch) -> None:
    shards = [_shard()]
    with _serving(shards, interceptors=[_WithoutUnary()]) as addresses:
        got, called, still = _train(addresses, True, monkeypatch)
    assert called.count("PushPullUnary") == 1 and called.count("PushPull") == 4 and still == [False]
    assert shards[0].applied_pushes == 4 and all(torch.isfinite(out).all() for out in got)


def test_a_reply_too_large_for_the_server_s_messages_goes_as_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    # The server's messages are at most 128 KiB. The worker's 8-bit push (40,040 bytes) fits, and its
    # fp32 reply (160,000 bytes) fits the worker's 256 KiB chunk, but not in one of the server's messages.
    layout = Layout.from_named_shapes([("w", (40_000,))])
    shards = [_shard(chunk_bytes=64 * 1024)]  # as psserver serve cuts replies for 128 KiB messages
    with _serving(shards, limits=ServerLimits(max_message_bytes=128 * 1024)) as addresses:
        with PSClient(addresses, layout, name="init", config=ClientConfig(chunk_bytes=64 * 1024)) as uploader:
            assert uploader.init(torch.zeros(layout.total_length))
        got, called, still = _train(
            addresses, True, monkeypatch, layout, init=False, push_dtype="int8", chunk_bytes=256 * 1024
        )
    assert called.count("PushPullUnary") == 1 and called.count("PushPull") == 4 and still == [False]
    assert shards[0].applied_pushes == 4 and shards[0].clock == 4
    assert shards[0].rejected == {"limit_reached": 1}
    assert all(torch.isfinite(out).all() for out in got)


@pytest.mark.parametrize(
    ("status", "refused"),
    [
        (grpc.StatusCode.UNIMPLEMENTED, True),  # a server without the call: no reason
        (refusal(Reason.UNKNOWN_DTYPE, "dtype 9"), False),  # UNIMPLEMENTED too, but it refuses the push
        (refusal(Reason.LIMIT_REACHED, "too big", {"limit": UNARY_REPLY_LIMIT}), True),
        (refusal(Reason.LIMIT_REACHED, "busy", {"limit": "receive_buffers"}), False),
        (refusal(Reason.BAD_REQUEST, "two headers"), False),
    ],
    ids=["no-such-call", "unknown-dtype", "reply-too-large", "receive-buffers", "bad-request"],
)
def test_only_a_refusal_of_the_call_itself_sends_the_push_as_streams(
    status: grpc.Status | grpc.StatusCode, refused: bool
) -> None:
    if isinstance(status, grpc.StatusCode):
        status = BareStatus(status, "Method not found!")
    assert refuses_unary(FakeRpcError(status)) is refused


def _push_plainly(
    addresses: list[str], unary: bool, monkeypatch: pytest.MonkeyPatch, layout: Layout = LAYOUT
) -> tuple[list[str], list[bool], list[bool]]:
    """An Init, then four pushes without the parameters back (as GEM and EASGD push), then one with
    them; the methods called, and whether each shard still takes PushUnary and PushPullUnary at the end."""
    methods = _watched(monkeypatch)
    generator = torch.Generator().manual_seed(5)
    with PSClient(addresses, layout, name="w") as client:
        client.init(torch.randn(layout.total_length, generator=generator))
        client.unary_pushes = [unary and fits for fits in client.unary_pushes]
        for _ in range(4):
            client.push(torch.randn(layout.total_length, generator=generator))
        client.push(torch.zeros(layout.total_length), pull_into=torch.empty(layout.total_length))
        return methods.called, client.unary_pushes, client.unary_push_pulls


def test_a_one_chunk_push_goes_as_one_call_and_applies_what_a_stream_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    params = {}
    for unary in (True, False):
        shards = [_shard(2, 0), _shard(2, 1)]
        with _serving(shards) as addresses:
            called, still, _ = _push_plainly(addresses, unary, monkeypatch, Layout.from_named_shapes(SHAPES, 2))
        assert called.count("PushUnary" if unary else "Push") == 8  # 4 pushes to each of 2 shards
        assert called.count("Push" if unary else "PushUnary") == 0 and still == [unary, unary]
        assert [s.applied_pushes for s in shards] == [5, 5]
        params[unary] = torch.cat([s.params for s in shards])
    assert torch.equal(params[True], params[False])


def test_a_server_without_push_unary_gets_push_streams_from_then_on_and_keeps_push_pull_unary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shards = [_shard()]
    with _serving(shards, interceptors=[_WithoutUnary("PushUnary")]) as addresses:
        called, pushes, push_pulls = _push_plainly(addresses, True, monkeypatch)
    assert called.count("PushUnary") == 1 and called.count("Push") == 4
    assert pushes == [False] and push_pulls == [True] and called.count("PushPullUnary") == 1
    assert shards[0].applied_pushes == 5 and shards[0].clock == 5


def test_a_push_larger_than_a_chunk_goes_as_a_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout.from_named_shapes([("w", (300_000,))])  # 1.2 MB in fp32: two 1 MiB chunks
    with _serving([_shard()]) as addresses:
        called, pushes, _ = _push_plainly(addresses, True, monkeypatch, layout)
    assert pushes == [False] and called.count("Push") == 4 and "PushUnary" not in called
