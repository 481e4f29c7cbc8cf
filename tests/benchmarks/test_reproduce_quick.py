"""The ``--quick`` reproduction runs end to end: JSON, plots and a markdown report, in a temporary directory."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.reproduce import main


def test_quick_reproduction_writes_json_plots_and_markdown(tmp_path: Path) -> None:
    doc = tmp_path / "docs" / "reproduction.md"
    main(["--quick", "--jobs", "1", "--seeds", "2", "--out", str(tmp_path), "--doc", str(doc)])
    summary = json.loads((tmp_path / "reproduction.json").read_text())
    assert summary["quick"] is True and set(summary["experiments"]) == {"ga", "ttt"}
    for key, data in summary["experiments"].items():
        assert data["verdict"] in {"reproduced", "partly", "not reproduced"}
        assert (tmp_path / f"repro_{key}.png").read_bytes().startswith(b"\x89PNG")
    text = doc.read_text()
    assert "## Gap-Aware" in text and "**Verdict:" in text and "repro_ga.png" in text
