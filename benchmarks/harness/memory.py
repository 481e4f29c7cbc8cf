"""What a hetps server must hold in memory, and the limit its peak RSS is held to."""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.harness.settings import LR
from psserver.core.rules import RuleSpec

# Peak RSS <= RSS_FACTOR x must-hold + RSS_SLACK_MB (a Python process with torch and gRPC
# starts at about 250 MB).
RSS_FACTOR, RSS_SLACK_MB = 2.0, 350.0


def rule_state_bytes(rule: str, rule_opts: Sequence[str], length: int) -> tuple[int, bool]:
    """Bytes of ``rule``'s state for ``length`` parameters, and whether it keeps a snapshot per worker."""
    options = {"lr": str(LR), **dict(opt.split("=", 1) for opt in rule_opts)}
    built = RuleSpec.parse(rule, options).build(length)
    state = sum(t.numel() * t.element_size() for t in built.state_tensors().values())
    return state, built.needs_snapshot


def rss_limit_mb(must_hold_mb: float) -> float:
    """The most peak RSS a server that must hold ``must_hold_mb`` may reach."""
    return RSS_FACTOR * must_hold_mb + RSS_SLACK_MB
