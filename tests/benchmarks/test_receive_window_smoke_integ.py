"""``benchmarks.receive_window --smoke``: both sections run on a tiny model and write the JSON the docs read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

from benchmarks.harness.models import tiny_shapes
from benchmarks.receive_window import main
from psproto.layout import Layout

pytestmark = pytest.mark.integration

SUMMARY_KEYS = {"median", "q1", "q3", "min", "max", "n"}


def test_smoke_run_compares_every_window_with_the_first(tmp_path: Path) -> None:
    out = tmp_path / "receive_window.json"
    main(["--smoke", "--windows", "auto,64KiB+HETPS_SMOKE_MARK=1", "--out", str(out)])
    results = json.loads(out.read_text())
    windows = ["auto", "64KiB+HETPS_SMOKE_MARK=1"]
    seen = results["server_environment"]
    # The added variable reached its own server only.
    assert seen["64KiB+HETPS_SMOKE_MARK=1"]["HETPS_SMOKE_MARK"] == "1"
    assert "HETPS_SMOKE_MARK" not in seen["auto"]
    assert list(results["steps"]) == windows and list(results["concurrency"]) == windows
    for window in windows:
        command = results["server_commands"][window]
        written = tomllib.loads(Path(command[command.index("--config") + 1]).read_text())
        assert written["transport"]["receive_window_bytes"] == ("auto" if window == "auto" else 65536)
        step = results["steps"][window]
        assert set(step["step_ms"]) == SUMMARY_KEYS and step["step_ms"]["n"] == 2 and step["step_ms"]["median"] > 0
        load = results["concurrency"][window]
        assert load["errors"] == 0, load["first_error"]
        assert load["aggregate_steps_per_s"]["median"] > 0
        assert step["peak_rss_mb"] > 0
    # The first window is the base of every ratio, so its own ratio is exactly 1.
    assert results["steps"]["auto"]["speed_vs_auto"]["median"] == 1.0
    assert results["concurrency"]["auto"]["speed_vs_auto"]["median"] == 1.0
    # ASGD keeps no state and no snapshots: a server must hold its fp32 parameters only.
    assert results["must_hold_mb"] == pytest.approx(Layout.from_named_shapes(tiny_shapes()).total_length * 4 / 1e6)


@pytest.mark.parametrize(
    ("windows", "message"),
    [
        ("auto", "at least two different settings"),
        ("4MiB,4194304", "at least two different settings"),
        ("4MiB+MALLOC_ARENA_MAX=1,4194304+MALLOC_ARENA_MAX=1", "at least two different settings"),
        ("4MiB,4MiB+arena=1", "is not NAME=VALUE with an upper-case NAME"),
        ("auto,4MB", "whole number of bytes, KiB, MiB or GiB"),
        ("auto,1KiB", "a window is 64KiB"),
    ],
)
def test_windows_that_cannot_be_compared_are_refused(
    windows: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--smoke", "--windows", windows, "--out", str(tmp_path / "x.json")])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
