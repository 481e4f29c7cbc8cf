"""Scoring beside the next race: a separate low-priority process gives the same score as scoring in place."""

from __future__ import annotations

from pathlib import Path

from experiments.harness.scoring import NICENESS, BackgroundScorer, _priority
from experiments.harness.snapshots import score
from pstasks.tasks import digits
from tests.experiments.trained import trained_digits_model


def test_the_background_scorer_gives_the_in_process_score_and_removes_its_spool_file(tmp_path: Path) -> None:
    task = digits()
    trained = trained_digits_model(task)
    untrained = [p.detach().clone() for p in task.build_model().parameters()]
    learned = [p.detach().clone() for p in trained.parameters()]
    snapshots = [(0.0, untrained), (1.0, learned), (2.0, learned)]
    expected = score(task, snapshots, target=0.9)
    assert expected.time_to_target == 1.0
    spool = tmp_path / "run" / "snapshots.pt"
    with BackgroundScorer("digits", None) as scorer:
        scored, seconds, _ = scorer.submit(snapshots, 0.9, spool).result(timeout=120)
        niceness = scorer.niceness()
    assert scored == expected
    assert seconds > 0
    assert not spool.exists()
    # The scorer runs at the lowest priority whatever this process's own is.
    assert niceness == max(NICENESS, _priority())


def test_runs_still_waiting_are_scored_on_several_processes_at_once(tmp_path: Path) -> None:
    task = digits()
    # Enough snapshots that a run takes a while: a second process starts before the first is free.
    snapshots = [(float(index), [p.detach().clone() for p in task.build_model().parameters()]) for index in range(300)]
    with BackgroundScorer("digits", None, processes=2) as scorer:
        futures = [scorer.submit(snapshots, 0.9, tmp_path / f"run-{index}.pt") for index in range(6)]
        pids = {future.result(timeout=300).pid for future in futures}
    assert len(pids) == 2
