"""InProcessService: the :class:`~psworker.service.ParameterService` over a server core shard in this process.

Joins, uploads, pulls and pushes go through the shard's own API (``join``; ``begin_upload``,
``decode_chunk``, ``finish_upload``; ``pull``; ``push`` with chunks from :func:`psproto.codec.encode`,
the same entry every RPC form of the server calls), so validation, consistency and rule
application are the server's. No network and no threads: the simulator runs its workers
through it in virtual time, and tests run the real worker procedures against a real shard.

``push_encoder`` sends pushes through psworker.push_encoding as PSClient does (with ``codec.INT8_BLOCK``:
the 8-bit codec, with error feedback unless turned off), so the shard decodes exactly what the wire
would carry; without one, pushes are float32 chunks of ``chunk_bytes``.

``hold_pull`` (the simulator's SSP) is consulted before every pull: when it says the shard
would make this worker wait, the pull is skipped and the service is marked ``parked``.
A refusal is the shard's own :class:`psserver.core.errors.ShardError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2
from psserver.core.shard import PushHeader, Shard
from psworker.push_encoding import PushEncoder
from psworker.service import PushResult


class InProcessService:
    """One worker (or observer) joined to an in-process shard that holds the whole model."""

    def __init__(
        self,
        shard: Shard,
        layout: Layout,
        name: str,
        *,
        device: str = "cpu",
        observer: bool = False,
        hold_pull: Callable[[int], bool] | None = None,
        chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES,
        push_encoder: PushEncoder | None = None,
    ) -> None:
        self.shard = shard
        self.layout = layout
        self._name = name
        self.worker_id = shard.join(name, device, observer, layout, layout.hash).worker.worker_id
        self._hold_pull = hold_pull
        self._chunk_bytes = chunk_bytes
        self._push_ids = 0
        self._push_encoder = push_encoder
        # Set when ``hold_pull`` skipped a pull; the simulator clears it when it releases the worker.
        self.parked = False
        rule = shard.rule
        assert rule is not None, "a shard always has a rule"
        self._rule = ps_pb2.RuleInfo(
            name=rule.name, worker_procedure=rule.worker_procedure, procedure_options=rule.procedure_options()
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def rule(self) -> ps_pb2.RuleInfo:
        return self._rule

    @property
    def initialized(self) -> bool:
        return bool(self.shard.initialized)

    @property
    def clock(self) -> int:
        return int(self.shard.workers[self.worker_id].pulled_clock)

    def init(self, flat: torch.Tensor) -> bool:
        assembler = self.shard.begin_upload(self.worker_id, self.layout.hash)
        for chunk in codec.encode(flat, chunk_bytes=self._chunk_bytes):
            self.shard.decode_chunk(assembler, chunk)
        applied, _ = self.shard.finish_upload(assembler)
        return bool(applied)

    def pull(self, out: torch.Tensor, reserve: bool = False) -> int:
        if self._hold_pull is not None and self._hold_pull(self.worker_id):
            self.parked = True
            return self.clock
        result = self.shard.pull(self.worker_id, ps_pb2.DTYPE_FLOAT32, exclusive=reserve)
        assembler = codec.Assembler(out)
        for chunk in result.chunks:
            assembler.add(chunk)
        assembler.finish()
        return int(result.clock)

    def push(
        self,
        flat: torch.Tensor,
        kind: ps_pb2.PayloadKind.ValueType = ps_pb2.PAYLOAD_KIND_GRADIENT,
        metadata: Mapping[str, float] | None = None,
        pull_into: torch.Tensor | None = None,
    ) -> list[PushResult]:
        self._push_ids += 1
        header = PushHeader(
            self.worker_id, self._push_ids, self.clock, int(kind), self.layout.hash, dict(metadata or {})
        )
        chunks: Iterable[codec.ChunkLike] = (
            codec.encode(flat, chunk_bytes=self._chunk_bytes)
            if self._push_encoder is None
            else self._push_encoder.chunks(0, flat)
        )
        outcome = self.shard.push(header, chunks)
        if pull_into is not None:
            self.pull(pull_into)
        return [PushResult.of(outcome)]

    def heartbeat(self, stats: Mapping[str, float]) -> None:
        self.shard.heartbeat(self.worker_id, dict(stats))

    def leave(self) -> None:
        self.shard.leave(self.worker_id)
