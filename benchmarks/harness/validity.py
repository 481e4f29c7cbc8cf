"""Whether a run's baselines held still: each against its own repeats, the peer against the bare ceiling.

A ratio against a baseline means something only when the baseline itself was measured well.
On a shared machine a baseline can be caught by someone else's job, or not be warmed up, and
then a target passes or misses on the baseline's bad luck. (Every server process applies hetps's
allocator settings itself, psserver.allocator.) The step benchmarks therefore check, after
measuring:

- **repeats**: a baseline's per-repeat medians lie within ``REPEAT_SPREAD_BOUND`` of each
  other (max / min). Per-repeat medians of the bare mover moved by up to 1.25x within quick
  runs on the 2-core machine; a peer still warming up showed 5.4x (297.7 ms, then 55.8);
- **ceiling**: the peer's step time over the bare gRPC mover's (1 shard, same wire dtype), per
  repeat, median within ``PEER_VS_BARE_BOUNDS``. TensorPipe over TCP was 0.79x to 1.2x the bare
  mover's time in full runs; a peer 2x faster than a byte mover is not crossing TCP like it
  (shared memory), and one 2x slower is not running like the documented peer (an earlier run
  measured it at 193.7 ms, 3x the bare mover's 63.7 ms).

A check that fails names the systems it concerns; every target judged against one of them is
reported INVALID (never PASS), and the results say which check failed and why.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

REPEAT_SPREAD_BOUND = 1.5
PEER_VS_BARE_BOUNDS = (0.5, 2.0)

Check = dict[str, Any]


def repeat_spread_check(system: str, repeat_medians: Sequence[float], bound: float = REPEAT_SPREAD_BOUND) -> Check:
    """Max over min of ``system``'s per-repeat medians, at most ``bound``."""
    if not repeat_medians or min(repeat_medians) <= 0:
        return _check("repeats", [system], float("nan"), f"<= {bound}", False, "no positive repeat medians")
    value = max(repeat_medians) / min(repeat_medians)
    ok = value <= bound
    why = "" if ok else f"its per-repeat medians span {value:.2f}x (more than {bound}x): it did not hold still"
    return _check("repeats", [system], value, f"<= {bound}", ok, why)


def ceiling_check(
    peer: str,
    bare: str,
    peer_repeats: Sequence[float],
    bare_repeats: Sequence[float],
    bounds: tuple[float, float] = PEER_VS_BARE_BOUNDS,
) -> Check:
    """The median over repeats of the peer's time / the bare mover's time, within ``bounds``."""
    low, high = bounds
    ratios = [p / b for p, b in zip(peer_repeats, bare_repeats, strict=True) if b > 0]
    if not ratios:
        return _check("ceiling", [peer], float("nan"), f"{low}..{high}", False, "no repeats to compare")
    value = statistics.median(ratios)
    ok = low <= value <= high
    why = ""
    if value < low:
        why = (
            f"{peer} took {value:.2f}x the time of {bare}: faster than the bare byte mover by more than {1 / low:.1f}x"
        )
    elif value > high:
        why = f"{peer} took {value:.2f}x the time of {bare}: slower than the bare byte mover by more than {high:.1f}x"
    return _check("ceiling", [peer], value, f"{low}..{high}", ok, why)


def _check(name: str, systems: list[str], value: float, bound: str, ok: bool, why: str) -> Check:
    return {"check": name, "systems": systems, "value": value, "bound": bound, "ok": ok, "why": why}


def summarize_checks(checks: Iterable[Check]) -> dict[str, Any]:
    """``valid`` (every check passed), the checks, and which systems are out of line."""
    listed = list(checks)
    out_of_line = sorted({system for check in listed if not check["ok"] for system in check["systems"]})
    return {"valid": all(check["ok"] for check in listed), "out_of_line": out_of_line, "checks": listed}


def invalidate(target: dict[str, Any], depends_on: Iterable[str], validity: Mapping[str, Any]) -> dict[str, Any]:
    """``target`` marked INVALID (``pass`` false, ``invalid`` with the failed checks' reasons) when it
    is judged against a system that is out of line, or when a check concerning every system failed."""
    systems = set(depends_on)
    failed = [
        check
        for check in validity["checks"]
        if not check["ok"] and (check["check"] == "settings" or systems & set(check["systems"]))
    ]
    if failed:
        target["pass"] = False
        target["invalid"] = [f"{check['check']}: {check['why']}" for check in failed]
    return target
