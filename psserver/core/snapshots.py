"""The exact parameters at each clock some worker pulled, for rules that measure the gap.

A version is shared by every worker that pulled the same clock and dropped when no worker
references it any more. A memory cap bounds how many versions are kept: past it the oldest
version is dropped, and a push computed on it is applied as if its gap were zero (the rule
reports ``snapshot_missing``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class SnapshotStore:
    def __init__(self, memory_cap_bytes: int) -> None:
        self.memory_cap_bytes = memory_cap_bytes
        self._versions: dict[int, torch.Tensor] = {}
        self.dropped_for_memory = 0

    def get(self, clock: int) -> torch.Tensor | None:
        return self._versions.get(clock)

    def keep(self, clock: int, params: torch.Tensor) -> None:
        """Keep ``params`` (already a private copy) as the version of ``clock``."""
        self._versions[clock] = params
        per_version = params.numel() * params.element_size()
        while len(self._versions) > 1 and len(self._versions) * per_version > self.memory_cap_bytes:
            del self._versions[min(self._versions)]
            self.dropped_for_memory += 1

    def retain_only(self, clocks: Iterable[int]) -> None:
        wanted = set(clocks)
        for clock in [c for c in self._versions if c not in wanted]:
            del self._versions[clock]

    @property
    def bytes_held(self) -> int:
        return sum(v.numel() * v.element_size() for v in self._versions.values())

    def __len__(self) -> int:
        return len(self._versions)
