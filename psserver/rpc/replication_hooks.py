"""What the transport asks of replication, whatever serves it (psserver.replication on a replica
set, nothing on a lone server): may a call run here, when may a change be acknowledged, and what
Status says of this replica."""

from __future__ import annotations

from typing import Protocol

import grpc

from psproto.v1 import ps_pb2


class Replication(Protocol):
    def admission(self, method: str) -> grpc.Status | None:
        """None when ``method`` may run on this server; else the refusal to end it with."""
        ...

    async def settled(self, changed: bool = False) -> None:
        """Return once what the call changed may be acknowledged (every in-sync backup holds it);
        raise a ShardError (NOT_PRIMARY) when this server may no longer acknowledge anything.
        ``changed``: the call made a change the shard's events do not tell (an Init)."""
        ...

    def status(self) -> ps_pb2.ReplicaStatus | None: ...


class Unreplicated:
    """A lone server: everything runs, and a change is acknowledged once the shard made it."""

    def admission(self, method: str) -> grpc.Status | None:
        return None

    async def settled(self, changed: bool = False) -> None:
        return None

    def status(self) -> ps_pb2.ReplicaStatus | None:
        return None


UNREPLICATED = Unreplicated()
