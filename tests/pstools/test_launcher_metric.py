"""The cluster report names the task's metric: accuracy as before, or validation loss with perplexity."""

from __future__ import annotations

import math

from pstools.launcher import ClusterReport


def test_an_accuracy_report_reads_as_it_always_has() -> None:
    report = ClusterReport("asgd", 0.9694, 0.0824, 1503, 14.5)
    assert report.metric == "accuracy" and report.higher_is_better
    assert report.describe() == "test accuracy 0.9694 (loss 0.0824)"


def test_a_loss_report_gives_validation_loss_and_perplexity() -> None:
    loss = math.log(9.44)
    report = ClusterReport("diloco-dn", 0.38, loss, 21, 105.3, metric="loss", higher_is_better=False)
    assert report.describe() == f"validation loss {loss:.4f} (perplexity 9.44)"
