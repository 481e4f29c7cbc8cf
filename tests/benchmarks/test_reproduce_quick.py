"""The ``--quick`` reproduction runs end to end: JSON, plots and a markdown report, in a temporary directory."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.repro_plots import series_styles
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


def test_every_series_of_a_crowded_plot_looks_different() -> None:
    labels = [f"{method} λ={lam}" for lam in (1, 5, 10, 20) for method in ("AGN", "DynSGD", "EASGD")]
    styles = series_styles(labels)
    looks = {(s["color"], s["marker"], s["linestyle"]) for s in styles.values()}
    assert len(looks) == len(labels)
    assert len({styles[f"AGN λ={lam}"]["color"] for lam in (1, 5, 10, 20)}) == 1
    assert len({styles[f"{method} λ=5"]["color"] for method in ("AGN", "DynSGD", "EASGD")}) == 3
    few = series_styles(["ASGD", "SA", "GA"])
    assert len({s["color"] for s in few.values()}) == 3
