"""What a hetps server refused and whom it evicted, read from its Prometheus endpoint: a benchmark's
load counts its cost.

``hetps_rejected_requests_total`` has one series per reason (psserver/metrics.py). A limit that
bounds memory by refusing pushes (``shard.max_receiving_pushes``, ``shard.receive_buffers``) is paid for
in refusals its workers retry after a backoff; a benchmark reads the counts before and after a
load and reports the difference beside the memory it saved.
"""

from __future__ import annotations

import urllib.request
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

REJECTED = "hetps_rejected_requests"
EVICTIONS = "hetps_evictions"


def _totals(metrics_port: int | None, name: str) -> Counter[str]:
    """The counter ``name``'s total so far, by reason label (empty when the server serves no metrics)."""
    counts: Counter[str] = Counter()
    if metrics_port is None:
        return counts
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == name + "_total":
                counts[sample.labels.get("reason", "")] += int(sample.value)
    return counts


def rejected_requests(metrics_port: int | None) -> Counter[str]:
    """Requests refused so far, by reason (empty when the server serves no metrics)."""
    return _totals(metrics_port, REJECTED)


def evictions(metrics_port: int | None) -> int:
    """Workers evicted so far because their lease ran out."""
    return sum(_totals(metrics_port, EVICTIONS).values())


def refused_during(before: Counter[str], after: Counter[str]) -> dict[str, int]:
    """The refusals between two readings, by reason (reasons with none left out)."""
    return {reason: after[reason] - before[reason] for reason in sorted(after) if after[reason] > before[reason]}
