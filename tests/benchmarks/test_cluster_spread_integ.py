"""benchmarks.cluster_spread: a tiny real run writes every run and the summary; bad counts are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.cluster_spread import main

pytestmark = pytest.mark.integration


def test_a_tiny_run_writes_each_run_and_the_summary(tmp_path: Path) -> None:
    result = main(["--rule", "asgd", "--lr", "0.05", "--updates", "20", "--runs", "1", "--out", str(tmp_path)])
    written = json.loads((tmp_path / "cluster_spread.json").read_text())
    assert written == result
    (run,) = written["runs"]
    assert run["clock"] >= 20 and 0.0 <= run["test_accuracy"] <= 1.0
    assert written["min"] == written["max"] == written["median"] == run["test_accuracy"]
    assert len(run["max_staleness"]) == len(written["slowdowns"]) == 4


def test_slowdowns_set_the_workers_and_a_bad_mix_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    written = main(["--lr", "0.05", "--updates", "10", "--runs", "1", "--slowdowns", "1:3", "--out", str(tmp_path)])
    assert written["slowdowns"] == [1.0, 3.0]
    assert len(written["runs"][0]["max_staleness"]) == 2
    for mix in ("1:x", "1:0.5"):
        with pytest.raises(SystemExit) as exited:
            main(["--lr", "0.05", "--slowdowns", mix, "--out", str(tmp_path / mix)])
        assert exited.value.code == 2 and "--slowdowns" in capsys.readouterr().err
        assert not (tmp_path / mix).exists()


@pytest.mark.parametrize("flag", ["--runs", "--updates"])
def test_counts_below_one_are_refused(flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--lr", "0.05", flag, "0", "--out", str(tmp_path)])
    assert exited.value.code == 2 and flag in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_consistency_model_reaches_the_server_and_the_json(tmp_path: Path) -> None:
    written = main(["--lr", "0.3", "--updates", "10", "--runs", "1", "--consistency", "bsp", "--out", str(tmp_path)])
    assert written["server_args"] == ["--consistency", "bsp"]
    (run,) = written["runs"]
    # Under BSP every update waits for every worker: nothing is stale, as it would be asynchronously.
    assert run["clock"] >= 10 and run["max_staleness"] == [0, 0, 0, 0]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ssp-bound", "2"], "--ssp-bound applies only with --consistency ssp"),
        (["--consistency", "ssp"], "--consistency ssp needs --ssp-bound N"),
    ],
)
def test_an_ssp_bound_goes_with_ssp_only(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--lr", "0.05", *flags, "--out", str(tmp_path)])
    assert exited.value.code == 2 and message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
