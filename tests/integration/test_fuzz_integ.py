"""Malformed input on every RPC of a live server: random bytes, wrong sizes, huge shapes and
offsets, bad dtypes, NaN, truncated and cancelled streams. The server never crashes, answers
with an error status, and its parameters and clock stay exactly as they were."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psproto.layout import Layout
from psproto.v1 import ps_pb2
from pstools.launcher import start_server
from pstools.warm_start import stop_process
from psworker.client import PSClient

pytestmark = pytest.mark.integration

LAYOUT = Layout.from_named_shapes([("w", (6, 4)), ("b", (8,))])
N = LAYOUT.total_length
SERVICE = "/psproto.v1.ParameterServer/"
UNARY = ("Join", "Heartbeat", "Leave", "Status", "Checkpoint")
# The one-message forms of a push: the stream's messages joined into one request.
ONE_MESSAGE = ("PushPullUnary", "PushUnary")
# RPCs that only read (or write a checkpoint): random bytes may parse as a valid request for them.
MAY_SUCCEED = {"Heartbeat", "Status", "Checkpoint", "Leave", "Pull"}


class Fuzzer:
    def __init__(self, address: str, worker_id: int) -> None:
        self.channel = grpc.insecure_channel(address)
        self.worker_id = worker_id
        identity = {"request_serializer": None, "response_deserializer": None}
        self.unary = {m: self.channel.unary_unary(SERVICE + m, **identity) for m in UNARY}
        self.pull = self.channel.unary_stream(SERVICE + "Pull", **identity)
        self.init = self.channel.stream_unary(SERVICE + "Init", **identity)
        self.push = self.channel.stream_unary(SERVICE + "Push", **identity)
        self.push_pull = self.channel.stream_stream(SERVICE + "PushPull", **identity)
        self.one_message = {m: self.channel.unary_unary(SERVICE + m, **identity) for m in ONE_MESSAGE}

    def raw(self, method: str, messages: list[bytes], cancel_after: int | None) -> grpc.StatusCode | None:
        """The status the server answered; None when the client abandoned a stream (a local status only)."""
        unary = (*UNARY, "Pull", *ONE_MESSAGE)
        abandoned = cancel_after is not None and cancel_after < len(messages) and method not in unary

        def stream() -> Iterator[bytes]:
            for index, message in enumerate(messages):
                if cancel_after is not None and index >= cancel_after:
                    raise RuntimeError("the client gives up mid-stream")
                yield message

        try:
            if method in UNARY:
                self.unary[method](messages[0] if messages else b"", timeout=10)
            elif method == "Pull":
                list(self.pull(messages[0] if messages else b"", timeout=10))
            elif method == "PushPull":
                list(self.push_pull(stream(), timeout=10))
            elif method in ONE_MESSAGE:
                # The stream's messages joined, as the call carries them; a stream cut short, sent whole.
                sent = messages if cancel_after is None else messages[:cancel_after]
                self.one_message[method](b"".join(sent), timeout=10)
            else:
                {"Init": self.init, "Push": self.push}[method](stream(), timeout=10)
        except grpc.RpcError as error:
            return None if abandoned else error.code()
        return grpc.StatusCode.OK


def _chunk(offset: int, dtype: int, data: bytes) -> bytes:
    return ps_pb2.PushRequest(chunk=ps_pb2.Chunk(offset=offset, dtype=dtype, data=data)).SerializeToString()  # type: ignore[arg-type]


def _floats(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


# Each mutation makes an otherwise valid push invalid in one way.
MUTATIONS = (
    "short",
    "long",
    "odd_bytes",
    "gap",
    "overlap",
    "huge_offset",
    "bad_dtype",
    "nan",
    "bad_hash",
    "future_clock",
    "bad_kind",
    "no_chunks",
    "unknown_worker",
    "two_headers",
    "truncated",
)


F32 = ps_pb2.DTYPE_FLOAT32
# Mutations of the chunks after a good header: (draw, the N values, a split point in 1..N-1) -> chunks.
BAD_CHUNKS: dict[str, Callable[[st.DrawFn, list[float], int], list[bytes]]] = {
    "short": lambda draw, values, split: [_chunk(0, F32, _floats(values[:split]))],
    "long": lambda draw, values, split: [_chunk(0, F32, _floats(values + values[:split]))],
    "odd_bytes": lambda draw, values, split: [_chunk(0, F32, _floats(values) + b"\x00" * draw(st.integers(1, 3)))],
    "gap": lambda draw, values, split: [
        _chunk(0, 1, _floats(values[:split])),
        _chunk(split + 1, 1, _floats(values[split + 1 :])),
    ],
    "overlap": lambda draw, values, split: [
        _chunk(0, 1, _floats(values[: split + 1])),
        _chunk(split, 1, _floats(values[split:])),
    ],
    "huge_offset": lambda draw, values, split: [_chunk(draw(st.integers(N, 2**64 - 1)), 1, _floats(values[:split]))],
    "bad_dtype": lambda draw, values, split: [_chunk(0, draw(st.integers(4, 2**31 - 1)), _floats(values))],
    "nan": lambda draw, values, split: [
        _chunk(
            0,
            F32,
            _floats([*values[:split], draw(st.sampled_from([math.nan, math.inf, -math.inf])), *values[split + 1 :]]),
        )
    ],
    "no_chunks": lambda draw, values, split: [],
}
# Mutations of the header before good chunks: draw -> the header fields replaced.
BAD_HEADER_FIELDS: dict[str, Callable[[st.DrawFn], dict[str, object]]] = {
    "bad_hash": lambda draw: {"layout_hash": draw(st.text(max_size=70))},
    "future_clock": lambda draw: {"base_clock": draw(st.integers(10**6, 2**64 - 1))},
    "bad_kind": lambda draw: {"kind": draw(st.sampled_from([ps_pb2.PAYLOAD_KIND_DELTA, 3, 77, 2**31 - 1]))},
    "unknown_worker": lambda draw: {"worker_id": draw(st.integers(10**6, 2**64 - 1))},
}


@st.composite
def bad_pushes(draw: st.DrawFn) -> tuple[str, list[bytes], int | None]:
    mutation = draw(st.sampled_from(MUTATIONS))
    header = {
        "worker_id": 0,  # filled in by the test
        "push_id": draw(st.integers(1, 2**63)),
        "base_clock": 0,
        "kind": ps_pb2.PAYLOAD_KIND_GRADIENT,
        "layout_hash": LAYOUT.hash,
    }
    values = draw(st.lists(st.floats(-1, 1, width=32), min_size=N, max_size=N))
    chunks = [_chunk(0, F32, _floats(values))]
    cancel_after: int | None = None
    split = draw(st.integers(1, N - 1))
    if mutation in BAD_CHUNKS:
        chunks = BAD_CHUNKS[mutation](draw, values, split)
    elif mutation in BAD_HEADER_FIELDS:
        header.update(BAD_HEADER_FIELDS[mutation](draw))
    elif mutation == "two_headers":
        chunks = [chunks[0], ps_pb2.PushRequest(header=ps_pb2.PushHeader(**header)).SerializeToString()]  # type: ignore[arg-type]
    elif mutation == "truncated":
        cancel_after = 1 + draw(st.integers(0, 1))
        chunks = [_chunk(0, 1, _floats(values[:split])), _chunk(split, 1, _floats(values[split:]))]
    return mutation, [ps_pb2.PushHeader(**header).SerializeToString(), *chunks], cancel_after  # type: ignore[arg-type]


def test_malformed_requests_never_change_the_server(tmp_path: Path) -> None:
    process, address = start_server(tmp_path, "momentum", 0.1, (), extra_args=["--checkpoint-dir", str(tmp_path / "c")])
    try:
        fuzzer = Fuzzer(address, 0)
        # Before any model exists: layouts that are too big, negative, or nonsense are refused.
        for layout, code in [
            (ps_pb2.Layout(tensors=[ps_pb2.TensorSpec(name="w", shape=[2**20, 2**20])]), "RESOURCE_EXHAUSTED"),
            (ps_pb2.Layout(tensors=[ps_pb2.TensorSpec(name="w", shape=[-4])]), "INVALID_ARGUMENT"),
            (ps_pb2.Layout(tensors=[]), "INVALID_ARGUMENT"),
            (ps_pb2.Layout(tensors=[ps_pb2.TensorSpec(name="w", shape=[4])], num_shards=3), "INVALID_ARGUMENT"),
        ]:
            request = ps_pb2.JoinRequest(worker_name="big", layout=layout).SerializeToString()
            assert fuzzer.raw("Join", [request], None).name == code, layout

        with (
            PSClient(address, LAYOUT, name="owner") as owner,
            PSClient(address, LAYOUT, name="checker", observer=True) as checker,
        ):
            owner.init(torch.linspace(-1, 1, N))
            owner.push(torch.ones(N))  # momentum state and clock 1
            expected = torch.empty(N)
            checker.pull(expected)
            clock = checker.clock

            def unchanged() -> None:
                assert process.poll() is None, "the server died"
                now = torch.empty(N)
                assert checker.pull(now) == clock
                assert torch.equal(now, expected)
                assert checker.status()[0].applied_pushes == 1

            methods = st.sampled_from([*UNARY, "Pull", "Init", "Push", "PushPull", *ONE_MESSAGE])
            messages = st.lists(st.binary(max_size=300), max_size=4)

            @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            @given(method=methods, payload=messages, cancel_after=st.none() | st.integers(0, 3))
            def random_bytes(method: str, payload: list[bytes], cancel_after: int | None) -> None:
                code = fuzzer.raw(method, payload, cancel_after)
                assert (code == grpc.StatusCode.OK and method in MAY_SUCCEED) or code != grpc.StatusCode.OK
                assert code != grpc.StatusCode.UNKNOWN, (method, payload)
                unchanged()

            @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            @given(push=bad_pushes(), method=st.sampled_from(["Push", "PushPull", *ONE_MESSAGE]))
            def malformed_pushes(push: tuple[str, list[bytes], int | None], method: str) -> None:
                mutation, messages, cancel_after = push
                header = ps_pb2.PushHeader.FromString(messages[0])
                if not header.worker_id:
                    header.worker_id = owner.sessions[0].worker_id
                messages[0] = ps_pb2.PushRequest(header=header).SerializeToString()
                code = fuzzer.raw(method, messages, cancel_after)
                if code is not None:
                    assert code not in (grpc.StatusCode.OK, grpc.StatusCode.UNKNOWN), (mutation, code)
                unchanged()

            random_bytes()
            malformed_pushes()
            # The owner's own next push still works: the refusals left no half-state behind.
            assert owner.push(torch.ones(N))[0].clock == clock + 1
    finally:
        assert stop_process(process) == 0
