"""A backup's side of replication: the ``ShardReplica`` service, holding the newest state received.

The state is held in memory (two buffers, reused: a state is received into the spare one while
the other holds the last), which is all the acknowledgement promises. A message of an older epoch
than this replica knows (from etcd, or from a newer primary's messages) is refused with
STALE_EPOCH: its sender was deposed. A replica that is itself the primary refuses every state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import torch

from psproto.errors import Reason
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.replication import state_wire
from psserver.rpc.status_codes import refusal, refuse

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldState:
    version: int
    clock: int
    epoch: int
    primary: str
    state: dict[str, Any]
    total_bytes: int


class Standby:
    """What a backup holds, and the epochs it has seen."""

    def __init__(self, is_primary: Callable[[], bool]) -> None:
        self._is_primary = is_primary
        self.known_epoch = 0
        self.held: HeldState | None = None
        self._spare: torch.Tensor | None = None
        self._held_buffer: torch.Tensor | None = None
        self.digest_mismatches = 0

    def saw_epoch(self, epoch: int) -> None:
        self.known_epoch = max(self.known_epoch, epoch)

    def take(self) -> HeldState | None:
        """The held state, handed over (on promotion): the standby holds nothing after it."""
        held, self.held = self.held, None
        self._spare = self._held_buffer = None
        return held

    def _buffer(self, size: int) -> torch.Tensor:
        spare = self._spare
        if spare is None or spare.numel() != size:
            spare = torch.empty(size, dtype=torch.uint8)
        self._spare = None
        return spare

    async def replicate(self, messages: AsyncIterator[ps_pb2.ReplicateRequest], context: Any) -> Any:
        first = await anext(messages, None)
        if first is None or first.WhichOneof("body") != "header":
            await refuse(context, refusal(Reason.BAD_REQUEST, "a Replicate stream must start with its header"))
        header = first.header
        refused = self._refusal(header.epoch)
        if refused is not None:
            await refuse(context, refusal(Reason.STALE_EPOCH, refused, {"epoch": str(self.known_epoch)}))
        self.saw_epoch(header.epoch)
        buffer = self._buffer(header.total_bytes)
        view = buffer.numpy()
        filled = 0
        async for message in messages:
            data = message.data
            if filled + len(data) > header.total_bytes:
                await refuse(context, refusal(Reason.BAD_REQUEST, "a Replicate stream longer than its header says"))
            view[filled : filled + len(data)] = np.frombuffer(data, dtype=np.uint8)
            filled += len(data)
        if filled != header.total_bytes:
            await refuse(context, refusal(Reason.WRONG_LENGTH, f"{filled} of {header.total_bytes} state bytes came"))
        matches = True
        if header.digest:
            digest = await asyncio.get_running_loop().run_in_executor(
                None, state_wire.digest_of, state_wire.bytes_of(buffer)
            )
            matches = digest == header.digest
            if not matches:
                self.digest_mismatches += 1
                _LOGGER.error("the state of version %d arrived with another digest", header.version)
        try:
            state = state_wire.decode(state_wire.bytes_of(buffer))
        except ValueError as error:
            await refuse(context, refusal(Reason.BAD_REQUEST, str(error)))
        refused = self._refusal(header.epoch)  # promoted meanwhile, or a newer primary spoke
        if refused is not None:
            await refuse(context, refusal(Reason.STALE_EPOCH, refused, {"epoch": str(self.known_epoch)}))
        self._spare, self._held_buffer = self._held_buffer, buffer
        self.held = HeldState(header.version, header.clock, header.epoch, header.primary, state, header.total_bytes)
        return ps_pb2.ReplicateResponse(
            version=header.version, digest_checked=bool(header.digest), digest_matches=matches
        )

    def _refusal(self, epoch: int) -> str | None:
        if self._is_primary():
            return f"this replica is the primary (epoch {self.known_epoch}); a state of epoch {epoch} is refused"
        if epoch < self.known_epoch:
            return f"epoch {epoch} is older than {self.known_epoch}: its primary was deposed"
        return None


class ShardReplicaServicer(ps_pb2_grpc.ShardReplicaServicer):
    def __init__(self, standby: Standby) -> None:
        self.standby = standby

    async def Replicate(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802
        return await self.standby.replicate(request_iterator, context)


def add_replica_service(standby: Standby) -> Callable[[grpc.aio.Server], None]:
    return lambda server: ps_pb2_grpc.add_ShardReplicaServicer_to_server(ShardReplicaServicer(standby), server)
