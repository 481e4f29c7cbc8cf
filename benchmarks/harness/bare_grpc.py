"""The transport's ceiling: a bare gRPC service that only moves a step's bytes, with hetps's chunking.

    python -m benchmarks.harness.bare_grpc [--ready-file PATH]   # prints "bare grpc listening on 127.0.0.1:PORT"

No protobuf and no parameter-server logic. ``Init`` (unary) hands the server a byte buffer
under a key (invocation metadata ``key``; a buffer larger than a message comes as its ``length``
alone, zeros); ``PushPull`` (client-streaming in,
server-streaming out) sends one step: the client streams its update as raw chunks of at most
``chunk_bytes``, the server copies each into the key's buffer at a running offset, then
answers with that buffer in chunks of the same size. Where the push and the reply are one chunk
each, the client sends the step as ``PushPullUnary`` instead (one message each way, the stream's
messages joined), as a hetps worker does (``psworker.transfer.fits_one_message``). Each side makes exactly the one copy
between the socket and its tensor that hetps's design allows (DESIGN.md, performance
principles), so this is the least any server with that design can do on the wire. The
client here converts to and from the wire dtype exactly like a hetps worker. With ``int8/bf16``
(8-bit pushes, bf16 pulls) it pushes a buffer of an 8-bit push's size (int8 values and a scale
per block) without encoding anything, and the server takes it into a buffer of that size
(invocation metadata ``push-bytes`` at Init): the transport's cost of those bytes alone. Once serving it
writes ``--ready-file`` in the format of ``psserver serve --ready-file`` (``psserver/ready.py``).

With ``arithmetic`` (invocation metadata ``arithmetic: PUSH/PULL`` at Init) the mover also does the
arithmetic every step of an SGD parameter server must do, and nothing else: the client encodes an
8-bit push with error feedback (a worker's own ``PushEncoder``), the server holds fp32 parameters,
decodes each chunk into a gradient buffer as it arrives with hetps's own ``codec.Assembler`` (its
checks, and its finiteness test once the push is whole),
applies ``p -= lr · g`` once the push is whole and answers with the parameters converted to the
pull dtype chunk by chunk. Its messages are a hetps PushPull's: a header (push id, base clock)
before the chunks, an acknowledgement (the new clock, the push's staleness) before the parameters.
An 8-bit chunk is its fp32 scales then its int8 values, cut at ``codec.chunk_spans``. It is the
least this design can do per step on a given machine: what hetps loses against it is hetps's own
work, what it loses against the plain mover is arithmetic and the protocol's two small messages.
With ``apply_by_span`` (metadata ``apply: by-span``) the apply is not made once before the reply
but span by span as the reply is sent, each reply chunk converted right after its span is updated
(while it is in cache), so the first bytes leave after one span's apply: what overlapping an
elementwise rule's update with the reply could gain on this design.
"""

from __future__ import annotations

import argparse
import os
import struct
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import torch

from psproto import blocks, codec
from psproto.layout import Layout
from psserver.allocator import AllocatorConfig, apply_allocator
from psserver.ready import ReadyInfo, write_ready_file
from psworker.push_encoding import OnePush, PushEncoder
from psworker.transfer import fits_one_message

SERVICE = "hetps.bench.Bare"
MAX_MESSAGE_BYTES = codec.DEFAULT_MAX_MESSAGE_BYTES
OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
WIRE_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LR = 0.01
# Arithmetic mode's first message each way: (push id, base clock) in, (clock, staleness) out.
HEADER = struct.Struct("<QQ")
ACK = struct.Struct("<Qq")


def _wire_names(wire_dtype: str) -> tuple[str, str]:
    """(push, pull) of ``PUSH`` or ``int8/PULL``."""
    push, _, pull = wire_dtype.partition("/")
    if push == "int8" and pull in WIRE_TORCH_DTYPES:
        return push, pull
    if push not in WIRE_TORCH_DTYPES or (pull and pull != push):
        raise ValueError(f"bare wire dtype {wire_dtype!r}: one of {', '.join(WIRE_TORCH_DTYPES)}, or int8/PULL")
    return push, push


class _Arithmetic:
    """One key's fp32 parameters and the step's arithmetic on them (``arithmetic`` mode)."""

    def __init__(self, parameters: bytearray, wire_dtype: str, chunk_bytes: int, by_span: bool = False) -> None:
        push, pull = _wire_names(wire_dtype)
        self.by_span = by_span
        self.parameters = torch.frombuffer(parameters, dtype=torch.float32)
        self.gradient = torch.empty_like(self.parameters)
        self.pull = WIRE_TORCH_DTYPES[pull]
        self.push_dtype = codec.PUSH_DTYPE_NAMES[push]
        self.push_spans = codec.chunk_spans(self.parameters.numel(), self.push_dtype, chunk_bytes)
        self.pull_spans = codec.chunk_spans(self.parameters.numel(), codec.WIRE_DTYPE_NAMES[pull], chunk_bytes)
        self.clock = 0

    def receive(self, chunks: Iterator[bytes | memoryview]) -> None:
        """Decode one push's chunks into the gradient with hetps's own assembler (its checks, its
        finiteness test); a CodecError is a ValueError."""
        assembler = codec.Assembler(self.gradient, accept_blocks=True)
        for chunk, span in zip(chunks, self.push_spans, strict=True):
            view = memoryview(chunk)
            if self.push_dtype == codec.INT8_BLOCK:
                scale_bytes = 4 * blocks.block_count(len(span))
                assembler.add(codec.ChunkPayload(span.start, self.push_dtype, view[scale_bytes:], view[:scale_bytes]))
            else:
                assembler.add(codec.ChunkPayload(span.start, self.push_dtype, view))
        assembler.finish()
        if not assembler.all_finite():
            raise ValueError("the push is not finite")

    def replies(self) -> Iterator[bytes]:
        if not self.by_span:
            self.parameters.add_(self.gradient, alpha=-LR)
        for span in self.pull_spans:
            piece = self.parameters[span.start : span.stop]
            if self.by_span:
                piece.add_(self.gradient[span.start : span.stop], alpha=-LR)
            wire = piece if piece.dtype == self.pull else piece.to(self.pull)
            yield wire.view(torch.uint8).numpy().tobytes()


def _identity(data: bytes) -> bytes:
    return data


class _Store:
    """Byte buffers by key; one step at a time per key."""

    def __init__(self) -> None:
        # key: (the buffer pulls answer with, the buffer pushes land in (the same one unless their
        # sizes differ), chunk bytes)
        self._buffers: dict[str, tuple[bytearray, bytearray, int]] = {}
        self._arithmetic: dict[str, _Arithmetic] = {}
        self._lock = threading.Lock()

    def init(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        meta = dict(context.invocation_metadata())
        key = str(meta["key"])
        chunk_bytes = int(meta["chunk-bytes"])
        # A buffer larger than one message comes as its length alone: the plain mover moves bytes, whatever they hold.
        buffer = bytearray(int(meta["length"])) if "length" in meta else bytearray(request)
        if "arithmetic" in meta:
            with self._lock:
                by_span = meta.get("apply") == "by-span"
                self._arithmetic[key] = _Arithmetic(buffer, str(meta["arithmetic"]), chunk_bytes, by_span)
            return b""
        push_bytes = int(meta.get("push-bytes", len(buffer)))
        pushed = buffer if push_bytes == len(buffer) else bytearray(push_bytes)
        with self._lock:
            self._buffers[key] = (buffer, pushed, chunk_bytes)
        return b""

    def push_pull(self, requests: Iterator[bytes | memoryview], context: grpc.ServicerContext) -> Iterator[bytes]:
        key = str(dict(context.invocation_metadata())["key"])
        with self._lock:
            arithmetic = self._arithmetic.get(key)
        if arithmetic is not None:
            yield from self._push_pull_arithmetic(arithmetic, requests, context)
            return
        with self._lock:
            buffer, pushed, chunk_bytes = self._buffers[key]
        into = memoryview(pushed)
        offset = 0
        for chunk in requests:
            # The one copy on the way in: socket bytes into the server's buffer.
            into[offset : offset + len(chunk)] = chunk
            offset += len(chunk)
        if offset != len(pushed):
            context.abort(grpc.StatusCode.DATA_LOSS, f"received {offset} bytes, expected {len(pushed)}")
        view = memoryview(buffer)
        for start in range(0, len(buffer), chunk_bytes):
            # The one copy on the way out: the buffer into a reply message.
            yield bytes(view[start : start + chunk_bytes])

    def push_pull_unary(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """PushPull in one message each way, as a hetps worker sends a push and a reply of one chunk
        each (PushPullUnary): the request is the stream's messages joined, and so is the reply."""
        key = str(dict(context.invocation_metadata())["key"])
        with self._lock:
            arithmetic = key in self._arithmetic
        view = memoryview(request)
        replies = list(
            self.push_pull(iter([view[: HEADER.size], view[HEADER.size :]] if arithmetic else [view]), context)
        )
        return replies[0] if len(replies) == 1 else b"".join(replies)

    def _push_pull_arithmetic(
        self, arithmetic: _Arithmetic, requests: Iterator[bytes | memoryview], context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        try:
            _, base_clock = HEADER.unpack(next(requests))
            arithmetic.receive(requests)
        except (ValueError, struct.error, StopIteration) as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        arithmetic.clock += 1
        yield ACK.pack(arithmetic.clock, arithmetic.clock - 1 - base_clock)
        yield from arithmetic.replies()


def start(address: str = "127.0.0.1:0", threads: int = 32) -> tuple[grpc.Server, int]:
    store = _Store()
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Init": grpc.unary_unary_rpc_method_handler(store.init, _identity, _identity),
            "PushPull": grpc.stream_stream_rpc_method_handler(store.push_pull, _identity, _identity),
            "PushPullUnary": grpc.unary_unary_rpc_method_handler(store.push_pull_unary, _identity, _identity),
        },
    )
    server = grpc.server(ThreadPoolExecutor(max_workers=threads), options=[*OPTIONS, ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(address)
    server.start()
    return server, port


class BareClient:
    """A worker step over the bare service: one shard per server, fanned out like PSClient."""

    def __init__(
        self,
        servers: Sequence[str],
        layout: Layout,
        key: str,
        wire_dtype: str = "fp32",
        chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES,
        arithmetic: bool = False,
        apply_by_span: bool = False,
    ) -> None:
        if len(servers) != layout.num_shards:
            raise ValueError(f"{len(servers)} servers for {layout.num_shards} shards")
        self.layout = layout
        self.key = key
        push, pull = _wire_names(wire_dtype)
        self.dtype = WIRE_TORCH_DTYPES[pull]
        self.width = torch.empty((), dtype=self.dtype).element_size()
        self.chunk_bytes = max(self.width, chunk_bytes - chunk_bytes % self.width)
        self.wire_dtype = wire_dtype
        self.arithmetic = arithmetic
        if apply_by_span and not arithmetic:
            raise ValueError("apply_by_span needs arithmetic: the plain mover applies nothing")
        self.apply_by_span = apply_by_span
        # Arithmetic mode: pushes sent, and each shard's clock from its last acknowledgement.
        self._pushed = 0
        self._clocks = [0] * layout.num_shards
        # 8-bit pushes: per shard, a buffer of the push's size, sent as it is (nothing to encode)...
        self._pushes: list[bytes] | None = None
        # ...or, with the arithmetic, encoded with error feedback by a worker's own encoder.
        self._encoder: PushEncoder | None = None
        self._encoding: OnePush | None = None
        if push == "int8" and arithmetic:
            self._encoder = PushEncoder(codec.INT8_BLOCK, chunk_bytes=self.chunk_bytes)
        elif push == "int8":
            shards = (layout.shard(index) for index in range(layout.num_shards))
            self._pushes = [bytes(codec.wire_bytes(shard.length, codec.INT8_BLOCK)) for shard in shards]
        self.channels = [grpc.insecure_channel(address, options=OPTIONS) for address in servers]
        for channel in self.channels:
            grpc.channel_ready_future(channel).result(timeout=30)
        self._init = [
            c.unary_unary(f"/{SERVICE}/Init", request_serializer=_identity, response_deserializer=_identity)
            for c in self.channels
        ]
        self._push_pull = [
            c.stream_stream(f"/{SERVICE}/PushPull", request_serializer=_identity, response_deserializer=_identity)
            for c in self.channels
        ]
        self._push_pull_unary = [
            c.unary_unary(f"/{SERVICE}/PushPullUnary", request_serializer=_identity, response_deserializer=_identity)
            for c in self.channels
        ]
        # Per shard, as a hetps worker decides it: one message each way when the push and the reply fit a chunk.
        push_dtype, pull_dtype = codec.PUSH_DTYPE_NAMES[push], codec.WIRE_DTYPE_NAMES[pull]
        self.unary = [fits_one_message(r.length, push_dtype, pull_dtype, self.chunk_bytes) for r in layout.shards]
        self._metadata: tuple[tuple[str, str], ...] = (("key", key), ("chunk-bytes", str(self.chunk_bytes)))
        self._pool = futures.ThreadPoolExecutor(max_workers=max(1, len(servers)))

    def init(self, flat: torch.Tensor) -> None:
        for index, call in enumerate(self._init):
            shard = self.layout.shard(index)
            wire = flat[shard.offset : shard.end].to(torch.float32 if self.arithmetic else self.dtype)
            extra: tuple[tuple[str, str], ...] = ()
            if self.arithmetic:
                extra = (("arithmetic", self.wire_dtype), ("apply", "by-span" if self.apply_by_span else "whole"))
            elif self._pushes is not None:
                extra = (("push-bytes", str(len(self._pushes[index]))),)
            size = wire.numel() * wire.element_size()
            if size > MAX_MESSAGE_BYTES and not self.arithmetic:
                call(b"", metadata=(*self._metadata, *extra, ("length", str(size))), timeout=120)
                continue
            call(wire.view(torch.uint8).numpy().tobytes(), metadata=(*self._metadata, *extra), timeout=120)

    def step(self, update: torch.Tensor, out: torch.Tensor) -> None:
        """Send ``update`` and receive the server's buffer into ``out`` (both flat fp32)."""
        self._pushed += 1
        self._encoding = None if self._encoder is None else self._encoder.one_push(update)
        jobs = [self._pool.submit(self._step_shard, index, update, out) for index in range(len(self.channels))]
        for job in jobs:
            job.result()

    def _step_shard(self, index: int, update: torch.Tensor, out: torch.Tensor) -> None:
        shard = self.layout.shard(index)
        source = update[shard.offset : shard.end]
        # Each message as the buffers it is made of, uncopied: joined once, into its own message on a
        # stream or into the one request of a unary call.
        chunks: Iterator[tuple[bytes | memoryview, ...]]
        if self._encoding is not None:
            chunks = ((chunk.scales, chunk.data) for chunk in self._encoding.chunks(shard))
        elif self._pushes is None:
            wire = source if source.dtype == self.dtype else source.to(self.dtype)
            chunks = self._cut(wire.view(torch.uint8).numpy().data)
        else:
            chunks = self._cut(self._pushes[index])
        messages = self._with_header(index, chunks)

        destination = out[shard.offset : shard.end]
        position = 0
        replies: Iterator[bytes | memoryview]
        if self.unary[index]:
            request = b"".join(piece for pieces in messages for piece in pieces)
            view = memoryview(self._push_pull_unary[index](request, metadata=self._metadata, timeout=120))
            replies = iter([view[: ACK.size], view[ACK.size :]] if self.arithmetic else [view])
        else:
            requests = (b"".join(pieces) for pieces in messages)
            replies = iter(self._push_pull[index](requests, metadata=self._metadata, timeout=120))
        if self.arithmetic:
            self._clocks[index], _ = ACK.unpack(next(replies))
        for reply in replies:
            count = len(reply) // self.width
            destination[position : position + count].copy_(torch.frombuffer(reply, dtype=self.dtype))
            position += count
        if position != destination.numel():
            raise RuntimeError(f"bare step returned {position} elements, expected {destination.numel()}")

    def _with_header(
        self, index: int, chunks: Iterator[tuple[bytes | memoryview, ...]]
    ) -> Iterator[tuple[bytes | memoryview, ...]]:
        if self.arithmetic:
            yield (HEADER.pack(self._pushed, self._clocks[index]),)
        yield from chunks

    def _cut(self, data: memoryview | bytes) -> Iterator[tuple[memoryview]]:
        view = memoryview(data)
        for start in range(0, len(view), self.chunk_bytes):
            yield (view[start : start + self.chunk_bytes],)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()
        self._pool.shutdown(wait=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="bare gRPC byte mover (the benchmark's transport ceiling)")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--ready-file", type=Path, default=None, help="once serving, write the address here (JSON)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    server, port = start()
    print(f"bare grpc listening on 127.0.0.1:{port}", flush=True)
    if args.ready_file is not None:
        write_ready_file(args.ready_file, ReadyInfo("127.0.0.1", port, os.getpid(), 0, 1, "bare-grpc", 0, None))
    server.wait_for_termination()


if __name__ == "__main__":
    # The allocator settings of a hetps server (psserver serve applies them the same way).
    apply_allocator(AllocatorConfig())
    main()
