"""``benchmarks.receive_window --smoke``: both sections run on a tiny model and write the JSON the docs read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.receive_window import main

pytestmark = pytest.mark.integration

SUMMARY_KEYS = {"median", "q1", "q3", "min", "max", "n"}


def test_smoke_run_compares_every_window_with_the_first(tmp_path: Path) -> None:
    out = tmp_path / "receive_window.json"
    main(["--smoke", "--windows", "auto,64KiB,1MiB", "--out", str(out)])
    results = json.loads(out.read_text())
    windows = ["auto", "64KiB", "1MiB"]
    assert list(results["steps"]) == windows and list(results["concurrency"]) == windows
    for window in windows:
        command = results["server_commands"][window]
        assert command[command.index("--receive-window") + 1] == window
        step = results["steps"][window]
        assert set(step["step_ms"]) == SUMMARY_KEYS and step["step_ms"]["n"] == 2 and step["step_ms"]["median"] > 0
        load = results["concurrency"][window]
        assert load["errors"] == 0, load["first_error"]
        assert load["aggregate_steps_per_s"]["median"] > 0
        assert load["peak_rss_mb"] >= step["peak_rss_mb"] > 0
    # The first window is the base of every ratio, so its own ratio is exactly 1.
    assert results["steps"]["auto"]["speed_vs_auto"]["median"] == 1.0
    assert results["concurrency"]["auto"]["speed_vs_auto"]["median"] == 1.0
    assert results["rss_limit_mb"] == pytest.approx(1.5 * results["must_hold_mb"] + 300)


def test_a_single_window_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--smoke", "--windows", "auto", "--out", str(tmp_path / "x.json")])
    assert exit_info.value.code == 2
