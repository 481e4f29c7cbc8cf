"""Consistency models in front of any asynchronous rule, as pure decisions.

- ``async``: every push is applied on arrival.
- ``ssp`` (stale synchronous parallel, bound ``s``): a worker's clock ``c_w`` is its completed
  pushes; its pull waits while ``c_w − min_v c_v > s`` over live workers. ``s = 0`` is lock-step.
- ``bsp`` (bulk synchronous): the shard collects one update from every live worker, applies
  their mean once with the rule (τ ≡ 0), then releases them all.

A worker whose lease expires is evicted and leaves the minimum and the barrier, so a dead
worker never stalls the others.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable
from dataclasses import dataclass


class ConsistencyModel(enum.Enum):
    ASYNC = "async"
    SSP = "ssp"
    BSP = "bsp"


@dataclass(frozen=True)
class Consistency:
    # async, ssp (bounded staleness) or bsp (bulk synchronous).
    model: ConsistencyModel = ConsistencyModel.ASYNC
    # SSP's bound s: how many pushes a worker may run ahead of the slowest live worker.
    staleness_bound: int = 3

    def __post_init__(self) -> None:
        if self.staleness_bound < 0:
            raise ValueError(f"the SSP bound must be >= 0, got {self.staleness_bound}")


def ssp_must_wait(worker_clock: int, live_clocks: Iterable[int], bound: int) -> bool:
    """True while a worker ``worker_clock`` pushes in is more than ``bound`` ahead of the slowest."""
    slowest = min(live_clocks, default=worker_clock)
    return worker_clock - slowest > bound


def bsp_round_complete(contributors: Collection[int], live_workers: Collection[int]) -> bool:
    """True once every live worker has contributed to the round (and at least one has)."""
    return bool(contributors) and set(live_workers) <= set(contributors)
