"""Who is joined to the shard: worker records, their leases, and the push-id memory per name.

A push-id memory belongs to a worker *name*: a worker that joins again with ``resume`` (after
an eviction, a network failure or a server restart) keeps it, so a push it retries is never
applied twice. Memories of names no joined worker uses are kept up to ``IDLE_MEMORIES_KEPT``.

Not thread-safe on its own: the shard calls it under its lock. Removing a worker here only
forgets it; what else a departure releases (the rule's per-worker state, what others wait
on, a barrier) is the shard's to do.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from psserver.core.errors import ErrorKind
from psserver.core.refusals import Refusals
from psserver.core.workers import PushMemory, WorkerRecord

_LOGGER = logging.getLogger(__name__)

# Push-id memories kept for names no joined worker uses (re-joining workers find theirs).
IDLE_MEMORIES_KEPT = 4096


class Membership:
    def __init__(self, refusals: Refusals, lease_seconds: float, max_workers: int) -> None:
        self._refusals = refusals
        self.lease_seconds = lease_seconds
        self.max_workers = max_workers
        self.workers: dict[int, WorkerRecord] = {}
        self.evictions = 0
        self._memories: dict[str, PushMemory] = {}
        self._next_id = 1  # never reused, also across a restore
        # (the version it was worked out at, the slowest SSP clock then): ``slowest_clock``.
        self._slowest: tuple[int, list[int]] = (-1, [])

    def admission(self, name: str, resume: bool, now: float) -> list[int]:
        """Check that ``name`` may join; the ids of the records a resuming worker replaces.

        Without ``resume`` a name another joined worker uses is refused: two running workers
        under one name would share its push-id memory, and a push one of them retries could be
        applied twice. The caller removes the replaced records, then ``enrol``s the worker."""
        namesake = next((w for w in self.workers.values() if w.name == name), None)
        if namesake is not None and not resume:
            self._refusals.refuse(
                ErrorKind.NAME_IN_USE,
                f"worker name {name!r} is in use by joined worker {namesake.worker_id} (last request "
                f"{now - namesake.last_seen:.0f} s ago); give every worker a unique name. A stopped worker's "
                f"record is evicted once it has been silent for {self.lease_seconds:g} s (shard.lease_seconds); a "
                "worker continuing its own record joins with resume",
            )
        replaced = [w.worker_id for w in self.workers.values() if resume and w.name == name]
        if len(self.workers) - len(replaced) >= self.max_workers:
            self._refusals.refuse(
                ErrorKind.LIMIT_REACHED,
                f"this shard already has {len(self.workers)} joined workers and observers, its limit "
                "(shard.max_workers in the server's --config file); raise it or stop some workers",
            )
        return replaced

    def enrol(self, name: str, device: str, observer: bool, resume: bool, now: float) -> WorkerRecord:
        """A new record for ``name`` (with its name's push-id memory when ``resume``), joined now."""
        memory = self._memories.get(name) if resume else None
        if memory is None:
            memory = PushMemory()
            self._memories.pop(name, None)
            self._memories[name] = memory
            self._forget_idle_memories()
        worker = WorkerRecord(self._next_id, name, device, observer, last_seen=now, memory=memory)
        self._next_id += 1
        # A newcomer starts level with the slowest live worker so SSP neither stalls nor rushes it.
        worker.ssp_clock = min((w.ssp_clock for w in self.live()), default=0)
        self.workers[worker.worker_id] = worker
        return worker

    def _forget_idle_memories(self) -> None:
        in_use = {w.name for w in self.workers.values()}
        idle = [name for name in self._memories if name not in in_use]
        for name in idle[: max(0, len(idle) - IDLE_MEMORIES_KEPT)]:
            del self._memories[name]

    def get(self, worker_id: int) -> WorkerRecord:
        """The joined worker ``worker_id``; refused (UNKNOWN_WORKER) when there is none."""
        worker = self.workers.get(worker_id)
        if worker is None:
            self._refusals.refuse(
                ErrorKind.UNKNOWN_WORKER,
                f"worker id {worker_id} is not joined to this shard (it never joined, left, was evicted, or "
                "the server restarted); call Join again",
            )
        return worker

    def __contains__(self, worker_id: int) -> bool:
        return worker_id in self.workers

    def __iter__(self) -> Iterator[WorkerRecord]:
        return iter(list(self.workers.values()))

    def live(self) -> list[WorkerRecord]:
        """Joined workers that push (observers only pull)."""
        return [w for w in self.workers.values() if not w.observer]

    def slowest_clock(self, version: int) -> list[int]:
        """The slowest pushing worker's SSP clock (none without one), worked out once per ``version``
        (the shard's count of changes, which every change of a clock or of who is joined bumps):
        every waiting SSP pull asks at every change, and there may be hundreds."""
        if self._slowest[0] != version:
            clocks = [w.ssp_clock for w in self.live()]
            self._slowest = (version, [min(clocks)] if clocks else [])
        return self._slowest[1]

    def remove(self, worker_id: int) -> WorkerRecord:
        return self.workers.pop(worker_id)

    def expire(self, now: float) -> list[WorkerRecord]:
        """Workers silent for longer than the lease, counted and logged as evicted (the shard then
        removes them); one waiting inside the shard is alive."""
        deadline = now - self.lease_seconds
        expired = [w for w in self.workers.values() if w.last_seen < deadline and not w.waiting]
        for worker in expired:
            self.evictions += 1
            _LOGGER.warning(
                "evicted worker %s (%s): silent for more than %.1f s; it may join again",
                worker.worker_id,
                worker.name,
                self.lease_seconds,
            )
        return expired

    def pulled_clocks(self) -> list[int]:
        return [w.pulled_clock for w in self.workers.values()]

    # -- checkpoint form ------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "workers": [w.to_state() for w in self.workers.values()],
            "memories": {name: memory.to_state() for name, memory in self._memories.items()},
            "id_counter": self._next_id,
            "evictions": self.evictions,
        }

    def load_state_dict(self, state: Mapping[str, Any], now: float) -> None:
        """Replace every record and memory with the saved ones (all parsed before anything changes)."""
        memories = {str(name): PushMemory.from_state(m) for name, m in state["memories"].items()}
        workers = {}
        for saved_worker in state["workers"]:
            memory = memories.setdefault(str(saved_worker["name"]), PushMemory())
            record = WorkerRecord.from_state(saved_worker, memory, now)
            workers[record.worker_id] = record
        evictions = int(state["evictions"])
        first_id = max(int(state["id_counter"]), max(workers, default=0) + 1)
        self._memories, self.workers, self.evictions = memories, workers, evictions
        self._slowest = (-1, [])
        self._next_id = first_id
