"""The catalog: ``--tasks`` picks the digits, Fashion-MNIST or tinylm experiments, each on its own task."""

from __future__ import annotations

import pytest

from experiments.repro_catalog import experiments
from experiments.reproduce import main

CLAIMS = ("agn", "ab32", "ga", "gem", "ormo", "ttt")


def test_fashion_has_a_variant_of_every_claim_on_the_fashion_cnn() -> None:
    fashion = experiments(False, None, ["fashion"])
    assert [e.key for e in fashion] == [f"{key}-fashion" for key in (*CLAIMS, "diloco", "diloco-long")]
    for exp in fashion:
        assert exp.task == "fashion" and exp.title.endswith("(Fashion-MNIST CNN)")
        assert {p.config.task for p in exp.points} == {"fashion"}


def test_digits_keeps_its_experiments_and_their_titles() -> None:
    digits = experiments(False, None, ["digits"])
    assert [e.key for e in digits] == ["agn", "ab", "ab32", "ga", "gem", "ormo", "ttt"]
    assert all(e.task == "digits" and "Fashion" not in e.title for e in digits)
    assert {e.key for e in experiments(False, {"ab32", "ttt-fashion"})} == {"ab32", "ttt-fashion"}


def test_quick_stays_on_digits_whatever_the_tasks() -> None:
    assert [e.key for e in experiments(True, None, ["fashion"])] == ["ga", "ttt"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tasks", "cifar"], "unknown task(s) ['cifar']"),
        (["--tasks", ","], "unknown task(s)"),
        (["--reuse", "/nonexistent/reproduction.json"], "no such results file: /nonexistent/reproduction.json"),
    ],
)
def test_a_wrong_task_or_results_file_is_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--only", "none", *argv])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
