"""What one shard is configured with: its rule, its place in the model, and every limit.

The ``[shard]`` table of ``psserver serve --config`` (psserver.app); checked once, here, when made."""

from __future__ import annotations

from dataclasses import dataclass, field

from psproto import codec
from psserver.core.consistency import Consistency
from psserver.core.pace import TransferPace
from psserver.core.rules import RuleSpec


@dataclass(frozen=True)
class ShardConfig:
    rule: RuleSpec
    # Which shard of the model this server holds, 0 to num_shards - 1.
    shard_index: int = 0
    # How many servers the model is split over; every server and worker must say the same.
    num_shards: int = 1
    # A worker silent for this long is evicted (a heartbeat, pull or push renews it).
    lease_seconds: float = 30.0
    # Largest payload of a reply message (pulled parameters): at most half the largest message.
    chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES
    # Async, SSP (with its bound) or BSP, in front of the rule.
    consistency: Consistency = field(default_factory=Consistency)
    # Cap on parameter versions kept for gap-measuring rules (GA, DC-ASGD).
    snapshot_memory_bytes: int = 2 * 1024**3
    # An exclusive pull (a rule's hold on the shard until its worker pushes) lapses after this long.
    exclusive_pull_seconds: float = 10.0
    # Joined workers and observers at once; a Join past it is refused (RESOURCE_EXHAUSTED).
    max_workers: int = 1024
    # Elements one shard may hold; a first Join whose layout needs more is refused.
    max_parameters: int = 2**31
    # Pushes decoded at once, each into a buffer of the shard's size; more wait for a free one.
    receive_buffers: int = 2
    # Pushes open at once (from their header to the end of their stream), each holding the
    # transport's buffers for its stream while it waits for a receive buffer; one past it is
    # refused at its header (LIMIT_REACHED, limit receiving_pushes) and its worker sends it again
    # after a backoff. 0: no cap.
    max_receiving_pushes: int = 0
    # How long a push waits for a receive buffer before it is refused (RESOURCE_EXHAUSTED).
    receive_wait_seconds: float = 120.0
    # A push holding a receive buffer that sends nothing for this long is cancelled, so a
    # stalled (or hostile) client cannot keep the buffer from everyone else.
    receive_idle_seconds: float = 30.0
    # A push holding a receive buffer must keep this pace (psserver.core.pace), so a client
    # trickling its bytes cannot hold the buffer longer than an honest client needs.
    transfer_pace: TransferPace = field(default_factory=TransferPace)
    # Serialised parameter versions being sent at once (asynchronous training). At the limit a
    # pull gets the newest version already being sent instead of a newer one: the reply carries
    # that version's clock, so the worker's next push counts the extra staleness.
    pull_versions: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.shard_index < self.num_shards:
            raise ValueError(
                f"shard_index {self.shard_index} must be 0..{self.num_shards - 1} ({self.num_shards} shards)"
            )
        at_least_one = ("max_workers", "max_parameters", "receive_buffers", "snapshot_memory_bytes", "pull_versions")
        for name in at_least_one:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, not {getattr(self, name)}")
        if self.max_receiving_pushes < 0:
            raise ValueError(f"max_receiving_pushes must be >= 0 (0: no cap), not {self.max_receiving_pushes}")
        positive = ("lease_seconds", "receive_idle_seconds", "receive_wait_seconds", "exclusive_pull_seconds")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, not {getattr(self, name)}")
        refusal = self.rule.options.consistency_refusal(self.consistency.model)
        if refusal is not None:
            raise ValueError(refusal)
