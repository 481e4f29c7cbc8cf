"""``against_revision``: both trees step in one run, interleaved, and the revision's worktree goes away."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.against_revision import REPO_ROOT, main

pytestmark = pytest.mark.integration


def _worktrees() -> str:
    return subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "list"], capture_output=True, text=True).stdout


def test_a_smoke_run_steps_both_trees_in_every_round_and_removes_the_worktree(tmp_path: Path) -> None:
    out = tmp_path / "against_revision.json"
    main(["HEAD", "--models", "tiny", "--rounds", "2", "--steps", "3", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["revision"] == "HEAD" and results["command"].startswith("python -m benchmarks.against_revision HEAD")
    [row] = results["models"]
    assert row["model"] == "tiny"
    assert row["revision_step_ms"]["n"] == row["this_tree_step_ms"]["n"] == 6
    assert row["speed_ratio_per_round"]["n"] == 2 and row["speed_ratio_per_round"]["median"] > 0
    assert row["verdict"] in {"faster", "slower", "level"}
    assert "hetps-rev-" not in _worktrees()


def test_a_revision_that_is_no_commit_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["no-such-revision-here", "--out", str(tmp_path / "x.json")])
    assert exit_info.value.code == 2
    assert "'no-such-revision-here' is no commit of this repository" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
