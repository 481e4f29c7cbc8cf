"""``call_forms``: how its threaded pull differs from a small shard's, and usage errors for what the
command line can get wrong (its smoke runs: test_call_forms_integ.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.call_forms import form_options, main
from psworker.channels import SINGLE_THREADED_PULLS, channel_options


def test_the_threaded_pull_differs_from_a_small_shards_channel_only_in_how_pulls_are_read() -> None:
    assert form_options("single") == channel_options(single_threaded_pulls=True)
    assert [*form_options("threaded"), SINGLE_THREADED_PULLS] == form_options("single")


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--wire", "int8"], "--wire: int8; choose from"),
        (["--wire", ","], "--wire: none given"),
        (["--calls", "pull,init"], "--calls: init; choose from pull, push"),
        (["--parameters", "0"], "--parameters must be at least 1"),
        (["--repeats", "0"], "--repeats and --calls-per-repeat must be at least 1"),
    ],
)
def test_what_the_command_line_gets_wrong_is_a_usage_error(
    args: list[str], problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["--smoke", *args, "--out", str(tmp_path / "calls.json")])
    assert refused.value.code == 2
    assert problem in capsys.readouterr().err
