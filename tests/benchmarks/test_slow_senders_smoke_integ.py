"""``benchmarks.slow_senders`` on a short run: a row per trickler count, each trickling push's end kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.slow_senders import main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_a_short_run_writes_the_rates_and_how_the_trickling_pushes_ended(tmp_path: Path) -> None:
    out = tmp_path / "slow_senders.json"
    main(["--tricklers", "0,1", "--workers", "1", "--seconds", "1", "--repeats", "1", "--out", str(out)])
    results = json.loads(out.read_text())
    base, trickled = results["rows"]
    assert (base["tricklers"], trickled["tricklers"]) == (0, 1)
    assert base["pushes_per_s"]["median"] > 0 and base["vs_alone"]["median"] == 1.0
    assert base["trickling_pushes"] == [] and trickled["vs_alone"]["n"] == 1
    [end] = trickled["trickling_pushes"]
    assert (end["code"], end["reason"], end["limit"]) == ("CANCELLED", "PUSH_STALLED", "min_transfer_rate")
    assert trickled["push_stalled_counted"] == 1
    assert [t["comparison"] for t in results["targets"]] == [">="]
    assert results["command"].startswith("python -m benchmarks.slow_senders")
