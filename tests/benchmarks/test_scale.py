"""The pure parts of ``benchmarks.scale``: the sized models, the slope fit and the targets it judges."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.harness.crowd import shares
from benchmarks.scale import SLOPE_LIMIT, fit_line, memory_target, sized_shapes, slope_targets, worker_targets
from psproto.layout import Layout


def test_a_sized_model_has_about_its_parameters_and_splits_over_eight_shards() -> None:
    for parameters in (1_000_000, 124_000_000, 350_000_000):
        shapes = sized_shapes(parameters)
        layout = Layout.from_named_shapes(shapes, 8)
        assert abs(layout.total_length - parameters) < 1024
        assert all(rows <= 4096 for _, (rows, _) in shapes)
        # Balanced: no shard more than a tensor's worth above an eighth.
        assert max(s.length for s in layout.shards) - layout.total_length / 8 <= max(r * c for _, (r, c) in shapes)


def test_the_line_fit_is_least_squares_and_refuses_one_x() -> None:
    slope, intercept = fit_line([1.0, 2.0, 3.0], [2.0, 4.1, 5.9])
    assert slope == pytest.approx(1.95) and intercept == pytest.approx(0.1, abs=1e-9)
    with pytest.raises(ValueError, match="two distinct x"):
        fit_line([1.0, 1.0], [2.0, 3.0])


def _point(parameters: int, shards: int, hetps_ms: float, bare_ms: float) -> dict[str, Any]:
    step = {"hetps": {"median": hetps_ms}, "bare": {"median": bare_ms}}
    return {"parameters": parameters, "shards": shards, "bytes_per_step": 8 * parameters, "step_ms": step}


def test_the_slope_target_compares_seconds_per_gigabyte_per_shard_count() -> None:
    # hetps: 10 ms fixed + 1.5 s/GB; bare: 5 ms fixed + 1.0 s/GB (1.5x: a miss). 2 shards: 1.1x (a pass).
    points = [_point(n, 1, 10 + 1.5 * 8 * n / 1e6, 5 + 1.0 * 8 * n / 1e6) for n in (1_000_000, 10_000_000, 50_000_000)]
    points += [_point(n, 2, 9 + 1.1 * 8 * n / 1e6, 9 + 1.0 * 8 * n / 1e6) for n in (1_000_000, 10_000_000)]
    points += [_point(50_000_000, 4, 1.0, 1.0), {"parameters": 350_000_000, "shards": 2, "skipped": "memory"}]
    fits, targets = slope_targets(points)
    assert set(fits) == {"1", "2"}  # one size over 4 shards makes no line
    assert fits["1"]["seconds_per_gb"]["hetps"] == pytest.approx(1.5)
    assert fits["1"]["intercept_s"]["bare"] == pytest.approx(0.005)
    assert [(t["measured"], t["pass"]) for t in targets] == [(pytest.approx(1.5), False), (pytest.approx(1.1), True)]
    assert all(t["threshold"] == SLOPE_LIMIT and t["comparison"] == "<=" for t in targets)


def test_the_memory_target_is_the_worst_server_first_run_or_restored() -> None:
    server = {"shard": 0, "limit_mb": 1000.0, "peak_rss_mb": 600.0, "restored_peak_rss_mb": 900.0}
    points = [
        {"parameters": 10_000_000, "shards": 2, "servers": [server, server | {"shard": 1, "peak_rss_mb": 1100.0}]},
        {"parameters": 1_000_000, "shards": 1, "servers": [server]},
    ]
    (entry,) = memory_target(points)
    assert entry["measured"] == pytest.approx(1.1) and not entry["pass"]
    assert "10M x 2, shard 1" in entry["detail"]
    assert memory_target([{"parameters": 1, "shards": 1, "skipped": "memory"}]) == []


def test_a_worker_target_fails_on_any_problem_or_a_level_not_run() -> None:
    workers = {
        "async": {"levels": {"8": {"problems": {"errors": 3}}, "64": {"problems": {}}}},
        "bsp": {"levels": {"8": {"problems": {"stuck": 2, "evictions": 5}}, "64": {"not_run": "after 8"}}},
    }
    workers["ssp"] = {"error": "RuntimeError('the server did not start')"}
    passed, stalled, failed = worker_targets(workers)
    assert passed["target"] == "64 workers under async: problems" and passed["pass"] and passed["detail"] == "none"
    assert not stalled["pass"] and stalled["detail"] == "1 not run"
    assert not failed["pass"] and failed["detail"] == "1 failed"


def test_workers_are_dealt_evenly_over_the_load_processes() -> None:
    assert shares(10, 4) == [3, 3, 2, 2]
    assert shares(1, 4) == [1, 0, 0, 0]
    assert sum(shares(512, 4)) == 512
