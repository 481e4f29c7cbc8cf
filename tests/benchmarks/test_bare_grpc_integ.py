"""The bare gRPC mover (the transport's ceiling): what it moves for each wire dtype."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import torch

from benchmarks.harness import bare_grpc
from psproto import blocks, codec
from psproto.layout import Layout


@pytest.fixture
def address() -> Iterator[str]:
    server, port = bare_grpc.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


@pytest.mark.parametrize(("wire", "back"), [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_a_float_step_sends_the_update_and_gets_it_back(address: str, wire: str, back: torch.dtype) -> None:
    layout = Layout.from_named_shapes([("w", (3000,))], 1)
    client = bare_grpc.BareClient([address], layout, f"float-{wire}", wire, chunk_bytes=1024)
    try:
        client.init(torch.zeros(3000))
        update, out = torch.linspace(-1, 1, 3000), torch.empty(3000)
        client.step(update, out)
        assert torch.equal(out, update.to(back).float())  # the pushed buffer is what comes back
    finally:
        client.close()


def test_an_8bit_push_moves_its_size_and_the_pull_stays_bf16(address: str) -> None:
    length = 2 * 4096 + 10
    layout = Layout.from_named_shapes([("w", (length,))], 1)
    client = bare_grpc.BareClient([address], layout, "int8", "int8/bf16", chunk_bytes=1024)
    try:
        initial = torch.linspace(-2, 2, length)
        client.init(initial)
        out = torch.empty(length)
        for _ in range(2):
            client.step(torch.ones(length), out)
            # The push landed in a buffer of its own size, so the parameters come back as they were.
            assert torch.equal(out, initial.to(torch.bfloat16).float())
        assert [len(push) for push in client._pushes or []] == [codec.wire_bytes(length, codec.INT8_BLOCK)]
    finally:
        client.close()


def test_a_wire_dtype_the_mover_cannot_send_is_refused(address: str) -> None:
    layout = Layout.from_named_shapes([("w", (10,))], 1)
    with pytest.raises(ValueError, match="bare wire dtype 'bf16/fp32'"):
        bare_grpc.BareClient([address], layout, "k", "bf16/fp32")


@pytest.mark.parametrize("by_span", [False, True])
@pytest.mark.parametrize("wire", ["fp32", "bf16"])
def test_with_the_arithmetic_a_float_step_applies_sgd(address: str, wire: str, by_span: bool) -> None:
    """Applied at once or span by span as the reply goes out, the parameters come back the same."""
    length = 3000
    layout = Layout.from_named_shapes([("w", (length,))], 1)
    client = bare_grpc.BareClient(
        [address], layout, f"sgd-{wire}-{by_span}", wire, chunk_bytes=1024, arithmetic=True, apply_by_span=by_span
    )
    try:
        parameters = torch.linspace(-1, 1, length)
        client.init(parameters)
        update, out = torch.linspace(-3, 2, length), torch.empty(length)
        wire_dtype = bare_grpc.WIRE_TORCH_DTYPES[wire]
        for _ in range(2):
            client.step(update, out)
            parameters = parameters.add(update.to(wire_dtype).float(), alpha=-bare_grpc.LR)  # the server's op
            assert torch.equal(out, parameters.to(wire_dtype).float())
    finally:
        client.close()


def test_with_the_arithmetic_an_8bit_push_is_encoded_with_error_feedback(address: str) -> None:
    # Three chunks of the smallest size a worker's encoder takes (15 blocks each), the last one short.
    chunk_bytes = codec.MIN_CHUNK_BYTES
    length = 32 * 4096 + 10
    layout = Layout.from_named_shapes([("w", (length,))], 1)
    client = bare_grpc.BareClient([address], layout, "sgd-int8", "int8/bf16", chunk_bytes=chunk_bytes, arithmetic=True)
    try:
        parameters = torch.linspace(-2, 2, length)
        client.init(parameters)
        update, out = torch.linspace(-1, 3, length) ** 3, torch.empty(length)
        residual = torch.zeros(length)
        for _ in range(3):
            client.step(update, out)
            decoded = torch.empty(length)
            spans = codec.chunk_spans(length, codec.INT8_BLOCK, chunk_bytes)
            assert len(spans) == 3
            for span in spans:
                piece = slice(span.start, span.stop)
                values, scales, residual[piece] = blocks.encode_with_feedback(update[piece], residual[piece])
                blocks.decode(values, scales, decoded[piece])
            parameters.add_(decoded, alpha=-bare_grpc.LR)
            assert torch.equal(out, parameters.to(torch.bfloat16).float())
        assert client._clocks == [3]  # each step's acknowledgement came first
    finally:
        client.close()


def test_with_the_arithmetic_a_non_finite_push_is_refused(address: str) -> None:
    layout = Layout.from_named_shapes([("w", (10,))], 1)
    client = bare_grpc.BareClient([address], layout, "sgd-nan", "fp32", arithmetic=True)
    try:
        client.init(torch.zeros(10))
        update = torch.zeros(10)
        update[3] = float("nan")
        with pytest.raises(grpc.RpcError) as refused:
            client.step(update, torch.empty(10))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        client.close()


def test_applying_by_span_needs_the_arithmetic(address: str) -> None:
    layout = Layout.from_named_shapes([("w", (10,))], 1)
    with pytest.raises(ValueError, match="apply_by_span needs arithmetic"):
        bare_grpc.BareClient([address], layout, "k", "fp32", apply_by_span=True)


def test_with_the_arithmetic_an_8bit_chunk_with_a_negative_scale_is_refused(address: str) -> None:
    length = 4096
    layout = Layout.from_named_shapes([("w", (length,))], 1)
    client = bare_grpc.BareClient([address], layout, "sgd-neg", "int8/bf16", arithmetic=True)
    try:
        client.init(torch.zeros(length))
        calls = client._push_pull[0]
        header = bare_grpc.HEADER.pack(1, 0)
        chunk = torch.tensor([-1.0]).numpy().tobytes() + bytes(length)
        with pytest.raises(grpc.RpcError) as refused:
            list(calls(iter([header, chunk]), metadata=client._metadata, timeout=10))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "negative" in (refused.value.details() or "")
    finally:
        client.close()
