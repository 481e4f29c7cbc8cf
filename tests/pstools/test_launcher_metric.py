"""The cluster report names the task's metric (accuracy as before, or validation loss with perplexity) and
counts the shards' restarts."""

from __future__ import annotations

import math

from rich.console import Console

from pstools.cli import _print_report
from pstools.launcher import ClusterReport


def test_an_accuracy_report_reads_as_it_always_has() -> None:
    report = ClusterReport("asgd", 0.9694, 0.0824, 1503, 14.5)
    assert report.metric == "accuracy" and report.higher_is_better
    assert report.describe() == "test accuracy 0.9694 (loss 0.0824)"


def test_a_loss_report_gives_validation_loss_and_perplexity() -> None:
    loss = math.log(9.44)
    report = ClusterReport("diloco-dn", 0.38, loss, 21, 105.3, metric="loss", higher_is_better=False)
    assert report.describe() == f"validation loss {loss:.4f} (perplexity 9.44)"


def test_a_local_report_counts_its_replicas_restarts_only_when_there_were_any() -> None:
    for restarts, shown in ((0, False), (2, True)):
        console = Console(record=True, width=120)
        _print_report(console, ClusterReport("asgd", 0.9, 0.1, 400, 20.0, shard_restarts=restarts))
        printed = console.export_text()
        assert ("shard restarts: 2" in printed) == shown and "final test accuracy 0.9000" in printed, printed
