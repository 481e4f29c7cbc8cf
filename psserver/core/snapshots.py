"""The exact parameters at each clock some worker pulled, for rules that measure the gap.

A version is shared by every worker that pulled the same clock and dropped when no worker
references it any more. A memory cap bounds how many versions are kept: past it the oldest
version is dropped, and a push computed on it is applied as if its gap were zero (the rule
reports ``snapshot_missing``). Every such drop is logged as a warning and returned by
``keep``, so the shard can count it (``hetps_snapshots_dropped_total``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

_LOGGER = logging.getLogger(__name__)
_MIB = 1024 * 1024


class SnapshotStore:
    def __init__(self, memory_cap_bytes: int) -> None:
        self.memory_cap_bytes = memory_cap_bytes
        self._versions: dict[int, torch.Tensor] = {}
        self.dropped_for_memory = 0

    def get(self, clock: int) -> torch.Tensor | None:
        return self._versions.get(clock)

    def keep(self, clock: int, params: torch.Tensor) -> list[int]:
        """Keep ``params`` (already a private copy) as the version of ``clock``.

        Returns the clocks of the versions dropped to stay under the memory cap (oldest first);
        each drop is also logged as a warning."""
        self._versions[clock] = params
        per_version = params.numel() * params.element_size()
        dropped = []
        while len(self._versions) > 1 and len(self._versions) * per_version > self.memory_cap_bytes:
            oldest = min(self._versions)
            del self._versions[oldest]
            self.dropped_for_memory += 1
            dropped.append(oldest)
            _LOGGER.warning(
                "dropped the parameter version of clock %d: keeping it would exceed the snapshot memory cap of "
                "%.1f MiB (%d version(s) of %.1f MiB each fit). A push computed on it is applied with a gap of "
                "zero (snapshot_missing); raise shard.snapshot_memory_bytes in the server's --config file "
                "to keep one version per live worker "
                "(workers x %.1f MiB)",
                oldest,
                self.memory_cap_bytes / _MIB,
                max(1, self.memory_cap_bytes // per_version) if per_version else 0,
                per_version / _MIB,
                per_version / _MIB,
            )
        return dropped

    def retain_only(self, clocks: Iterable[int]) -> None:
        wanted = set(clocks)
        for clock in [c for c in self._versions if c not in wanted]:
            del self._versions[clock]

    @property
    def bytes_held(self) -> int:
        return sum(v.numel() * v.element_size() for v in self._versions.values())

    def __len__(self) -> int:
        return len(self._versions)
