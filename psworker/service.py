"""ParameterService: what a worker procedure asks of the parameter server, whatever carries it.

``psworker.client.PSClient`` implements it over gRPC (every shard of a running server);
``pstools.inprocess.InProcessService`` implements it over a server core shard in the same
process (the simulator and the tests). Procedures and start-up take this interface, never a
concrete client, so they run unchanged against either.

A service is joined once it is built: its constructor sends Join, and ``rule``,
``initialized`` and ``clock`` start as the Join reply gave them. ``leave`` ends membership.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from psproto.v1 import ps_pb2


class ServerMismatchError(RuntimeError):
    """The shards the client reached do not agree with the model it holds, or one answered out of protocol."""


class Acknowledgement(Protocol):
    """A push's acknowledgement as a shard gives it (a PushResponse, or the core's PushOutcome)."""

    @property
    def clock(self) -> int: ...
    @property
    def staleness(self) -> int: ...
    @property
    def duplicate(self) -> bool: ...
    @property
    def telemetry(self) -> Mapping[str, float]: ...
    @property
    def local_steps(self) -> int: ...


@dataclass(frozen=True)
class PushResult:
    """One shard's acknowledgement of a push."""

    clock: int
    staleness: int
    duplicate: bool
    telemetry: dict[str, float]
    # The local steps the shard assigns to this worker's next window; 0 when it assigns none.
    local_steps: int = 0

    @classmethod
    def of(cls, ack: Acknowledgement) -> PushResult:
        return cls(ack.clock, ack.staleness, ack.duplicate, dict(ack.telemetry), ack.local_steps)


class ParameterService(Protocol):
    """A joined worker's connection to the whole model (every shard) of a parameter server."""

    @property
    def name(self) -> str:
        """The worker name the service joined with."""

    @property
    def rule(self) -> ps_pb2.RuleInfo:
        """The server's rule, its worker procedure and that procedure's options (from Join)."""

    @property
    def initialized(self) -> bool:
        """Whether every shard holds parameters (someone sent Init)."""

    @property
    def clock(self) -> int:
        """The smallest shard clock among the parameters last pulled."""

    def init(self, flat: torch.Tensor) -> bool:
        """Upload initial parameters (flat fp32); True if this upload set them (the first one wins)."""

    def pull(self, out: torch.Tensor, reserve: bool = False) -> int:
        """Pull the parameters into ``out`` (flat fp32); returns :attr:`clock`.

        ``reserve`` (the wire's flag of an exclusive pull, for rules that take one) holds off other
        workers' pushes until this worker's next push."""

    def push(
        self,
        flat: torch.Tensor,
        kind: ps_pb2.PayloadKind.ValueType = ps_pb2.PAYLOAD_KIND_GRADIENT,
        metadata: Mapping[str, float] | None = None,
        pull_into: torch.Tensor | None = None,
    ) -> list[PushResult]:
        """Push a flat update computed on the last pull; one result per shard.

        With ``pull_into`` the new parameters come back into it in the same round trip."""

    def heartbeat(self, stats: Mapping[str, float]) -> None:
        """Renew the lease and report the worker's stats."""

    def leave(self) -> None:
        """Leave every shard; the service is unusable afterwards."""
