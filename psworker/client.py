"""PSClient: join every shard of a hetps server, upload, pull and push flat tensors.

The client fans each pull and push out to all shards concurrently; each shard reads and
writes its own slice of the caller's flat buffer, so no model-sized temporary is made.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import grpc
import torch

from psproto import codec, wire
from psproto.layout import Layout, ShardRange
from psproto.v1 import ps_pb2, ps_pb2_grpc

ResultT = TypeVar("ResultT")

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


class ServerMismatchError(RuntimeError):
    """The shards the client reached do not agree with the model it holds."""


_SERVICE = "/psproto.v1.ParameterServer/"


def _serialize(message: ps_pb2.PushRequest | ps_pb2.InitRequest | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


def _parse_push_pull(data: bytes) -> ps_pb2.PushResponse | wire.PulledChunk:
    field, body = wire.split_push_pull_response(data)
    return ps_pb2.PushResponse.FromString(bytes(body)) if field == 1 else wire.parse_pull_response(body)


class DataPath:
    """The bulk RPCs with hand-written (de)serialisers: chunks go out and come in without extra copies."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.init = channel.stream_unary(
            _SERVICE + "Init", request_serializer=_serialize, response_deserializer=ps_pb2.InitResponse.FromString
        )
        self.pull = channel.unary_stream(
            _SERVICE + "Pull",
            request_serializer=ps_pb2.PullRequest.SerializeToString,
            response_deserializer=wire.parse_pull_response,
        )
        self.push = channel.stream_unary(
            _SERVICE + "Push", request_serializer=_serialize, response_deserializer=ps_pb2.PushResponse.FromString
        )
        self.push_pull = channel.stream_stream(
            _SERVICE + "PushPull", request_serializer=_serialize, response_deserializer=_parse_push_pull
        )


@dataclass(frozen=True)
class ShardSession:
    address: str
    stub: ps_pb2_grpc.ParameterServerStub
    channel: grpc.Channel
    worker_id: int
    range: ShardRange
    join: ps_pb2.JoinResponse
    data: DataPath


@dataclass(frozen=True)
class PushResult:
    clock: int
    staleness: int
    duplicate: bool
    telemetry: dict[str, float]


class PSClient:
    """A worker's (or observer's) connection to every shard of one model."""

    def __init__(
        self,
        servers: str | Sequence[str],
        layout: Layout,
        name: str | None = None,
        device: str = "cpu",
        wire_dtype: str = "fp32",
        observer: bool = False,
        connect_timeout: float = 30.0,
        rpc_timeout: float = 120.0,
    ) -> None:
        addresses = [servers] if isinstance(servers, str) else list(servers)
        if len(addresses) != layout.num_shards:
            raise ValueError(f"{len(addresses)} server address(es) for a layout of {layout.num_shards} shard(s)")
        if wire_dtype not in codec.WIRE_DTYPE_NAMES:
            raise ValueError(f"wire dtype {wire_dtype!r} is not one of {', '.join(codec.WIRE_DTYPE_NAMES)}")
        self.layout = layout
        self.name = name or f"{socket.gethostname()}-{id(self):x}"
        self.wire_dtype = codec.WIRE_DTYPE_NAMES[wire_dtype]
        self.rpc_timeout = rpc_timeout
        self._push_ids = itertools.count(1)
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(addresses)), thread_name_prefix="psclient")
        self.sessions = [
            self._join(index, address, device, observer, connect_timeout) for index, address in enumerate(addresses)
        ]
        self.pulled_clocks = [s.join.clock for s in self.sessions]

    # -- membership -------------------------------------------------------------------

    def _join(self, index: int, address: str, device: str, observer: bool, timeout: float) -> ShardSession:
        channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        request = ps_pb2.JoinRequest(
            worker_name=self.name,
            device=device,
            role=ps_pb2.ROLE_OBSERVER if observer else ps_pb2.ROLE_WORKER,
            layout=self.layout.to_proto(),
            layout_hash=self.layout.hash,
        )
        reply: ps_pb2.JoinResponse = stub.Join(request, timeout=timeout, wait_for_ready=True)
        expected = self.layout.shard(index)
        if reply.shard_index != index or (reply.shard_offset, reply.shard_length) != (expected.offset, expected.length):
            channel.close()
            raise ServerMismatchError(
                f"{address} serves shard {reply.shard_index} [{reply.shard_offset}, "
                f"{reply.shard_offset + reply.shard_length}) but the layout puts shard {index} at "
                f"[{expected.offset}, {expected.end}); list the servers in shard order"
            )
        return ShardSession(address, stub, channel, reply.worker_id, expected, reply, DataPath(channel))

    @property
    def rule(self) -> ps_pb2.RuleInfo:
        return self.sessions[0].join.rule

    @property
    def initialized(self) -> bool:
        return all(s.join.initialized for s in self.sessions)

    def _fan_out(self, call: Callable[..., ResultT], *args: object) -> list[ResultT]:
        """Run ``call(session, *args)`` for every shard concurrently; re-raises the first error."""
        futures = [self._pool.submit(call, session, *args) for session in self.sessions]
        return [f.result() for f in futures]

    # -- parameters -------------------------------------------------------------------

    def init(self, flat: torch.Tensor) -> bool:
        """Upload initial parameters; True if this upload set them (the first one wins)."""
        results = self._fan_out(self._init_shard, flat)
        return all(bool(r) for r in results)

    def _init_shard(self, session: ShardSession, flat: torch.Tensor) -> bool:
        def requests() -> Iterator[ps_pb2.InitRequest | bytes]:
            yield ps_pb2.InitRequest(
                header=ps_pb2.InitHeader(worker_id=session.worker_id, layout_hash=self.layout.hash)
            )
            for payload in codec.payloads(flat[session.range.offset : session.range.end]):
                yield wire.chunk_in(2, payload.offset, payload.dtype, payload.data)

        reply: ps_pb2.InitResponse = session.data.init(requests(), timeout=self.rpc_timeout)
        return reply.applied

    def pull(self, out: torch.Tensor, reserve: bool = False) -> int:
        """Pull every shard into ``out`` (flat fp32); returns the smallest shard clock.

        ``reserve`` (GEM's atomic mode) holds off other workers' pushes until this worker's next push.
        """
        self._fan_out(self._pull_shard, out, reserve)
        return self.clock

    @property
    def clock(self) -> int:
        """The smallest clock among the shards' last pulled parameters."""
        return min(self.pulled_clocks)

    def _pull_shard(self, session: ShardSession, out: torch.Tensor, reserve: bool = False) -> int:
        request = ps_pb2.PullRequest(worker_id=session.worker_id, wire_dtype=self.wire_dtype, reserve=reserve)
        clock = self._receive_params(session.data.pull(request, timeout=self.rpc_timeout), session, out)
        self.pulled_clocks[session.range.index] = clock
        return clock

    @staticmethod
    def _receive_params(messages: Iterable[wire.PulledChunk], session: ShardSession, out: torch.Tensor) -> int:
        assembler = codec.Assembler(out[session.range.offset : session.range.end])
        clock = -1
        for message in messages:
            clock = message.clock
            assembler.add(message.chunk)
        assembler.finish()
        return clock

    def push(
        self,
        flat: torch.Tensor,
        kind: ps_pb2.PayloadKind.ValueType = ps_pb2.PAYLOAD_KIND_GRADIENT,
        metadata: Mapping[str, float] | None = None,
        pull_into: torch.Tensor | None = None,
    ) -> list[PushResult]:
        """Push a flat update computed on the last pull, one result per shard.

        With ``pull_into`` the new parameters come back in the same round trip (PushPull).
        """
        push_id = next(self._push_ids)
        results = self._fan_out(self._push_shard, flat, push_id, kind, dict(metadata or {}), pull_into)
        return [r for r in results if isinstance(r, PushResult)]

    def _push_shard(
        self,
        session: ShardSession,
        flat: torch.Tensor,
        push_id: int,
        kind: ps_pb2.PayloadKind.ValueType,
        metadata: dict[str, float],
        pull_into: torch.Tensor | None,
    ) -> PushResult:
        header = ps_pb2.PushHeader(
            worker_id=session.worker_id,
            push_id=push_id,
            base_clock=self.pulled_clocks[session.range.index],
            kind=kind,
            layout_hash=self.layout.hash,
            metadata=metadata,
            pull_dtype=self.wire_dtype,
        )
        requests = self._push_requests(header, flat[session.range.offset : session.range.end])
        if pull_into is None:
            reply: ps_pb2.PushResponse = session.data.push(requests, timeout=self.rpc_timeout)
            return PushResult(reply.clock, reply.staleness, reply.duplicate, dict(reply.telemetry))
        replies = iter(session.data.push_pull(requests, timeout=self.rpc_timeout))
        first = next(replies)
        if not isinstance(first, ps_pb2.PushResponse):
            raise ServerMismatchError("PushPull answered parameters before its acknowledgement")
        params = (message for message in replies if isinstance(message, wire.PulledChunk))
        self.pulled_clocks[session.range.index] = self._receive_params(params, session, pull_into)
        return PushResult(first.clock, first.staleness, first.duplicate, dict(first.telemetry))

    def _push_requests(self, header: ps_pb2.PushHeader, flat: torch.Tensor) -> Iterator[ps_pb2.PushRequest | bytes]:
        yield ps_pb2.PushRequest(header=header)
        # Chunks go out as wire bytes written straight from the tensor (psproto.wire).
        for payload in codec.payloads(flat, self.wire_dtype):
            yield wire.chunk_in(2, payload.offset, payload.dtype, payload.data)

    # -- housekeeping -----------------------------------------------------------------

    def heartbeat(self, stats: Mapping[str, float]) -> None:
        for session in self.sessions:
            session.stub.Heartbeat(
                ps_pb2.HeartbeatRequest(worker_id=session.worker_id, stats=dict(stats)), timeout=self.rpc_timeout
            )

    def status(self) -> list[ps_pb2.StatusResponse]:
        return [s.stub.Status(ps_pb2.StatusRequest(), timeout=self.rpc_timeout) for s in self.sessions]

    def close(self, leave: bool = True) -> None:
        """Leave every shard (best effort) and close the channels."""
        for session in self.sessions:
            if leave:
                # The server may already be gone; leaving is a courtesy.
                with contextlib.suppress(grpc.RpcError):
                    session.stub.Leave(ps_pb2.LeaveRequest(worker_id=session.worker_id), timeout=5.0)
            session.channel.close()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
