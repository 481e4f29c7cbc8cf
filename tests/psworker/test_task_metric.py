"""A task's metric: which number of an evaluation it is, which way is better, and how it reads."""

from __future__ import annotations

import math

import pytest

from pstasks.tasks import digits
from psworker.task import ACCURACY, LOSS, metric_named, perplexity


def test_accuracy_is_higher_is_better_and_the_default() -> None:
    assert digits().metric is ACCURACY
    assert ACCURACY.of(0.9, 0.3) == 0.9
    assert ACCURACY.reached(0.9, 0.9) and not ACCURACY.reached(0.89, 0.9)
    assert ACCURACY.better(0.9, 0.8) and not ACCURACY.better(0.8, 0.9)
    assert ACCURACY.worst == 0.0
    assert ACCURACY.describe(0.97, 0.0824) == "test accuracy 0.9700 (loss 0.0824)"


def test_loss_is_lower_is_better_with_perplexity_beside_it() -> None:
    assert LOSS.of(0.9, 1.25) == 1.25
    assert LOSS.reached(1.0, 1.0) and LOSS.reached(0.5, 1.0) and not LOSS.reached(1.01, 1.0)
    assert LOSS.better(1.0, 2.0) and not LOSS.better(2.0, 1.0)
    assert math.isinf(LOSS.worst)
    assert LOSS.describe(0.1, math.log(4.0)) == "validation loss 1.3863 (perplexity 4.00)"
    assert perplexity(math.log(6.0)) == pytest.approx(6.0)
    assert math.isinf(perplexity(math.inf)) and math.isinf(perplexity(math.nan)) and math.isinf(perplexity(1e6))


def test_metrics_are_found_by_name_and_unknown_names_are_refused() -> None:
    assert metric_named("accuracy") is ACCURACY and metric_named("loss") is LOSS
    with pytest.raises(ValueError, match="unknown metric 'f1'; known metrics: accuracy, loss"):
        metric_named("f1")
