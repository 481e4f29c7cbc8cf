"""``benchmarks.chunk_size``: every size of both systems stepped in turn, compared with the default size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.chunk_size import main, parse_sizes
from psproto import codec
from tests.benchmarks.refused import assert_refused


def test_sizes_are_parsed_sorted_and_checked() -> None:
    assert parse_sizes("2MiB, 512KiB,2MiB") == [512 * 1024, 2 * 1024**2]
    with pytest.raises(ValueError, match="below the smallest"):
        parse_sizes("1KiB")
    with pytest.raises(ValueError, match="not a number of bytes"):
        parse_sizes("1.5MiB")
    with pytest.raises(ValueError, match="at least one size"):
        parse_sizes(" , ")


def test_a_smoke_run_steps_both_systems_at_every_size(tmp_path: Path) -> None:
    out = tmp_path / "chunk_size.json"
    default = codec.DEFAULT_CHUNK_BYTES
    assert main(["--smoke", "--sizes", f"64KiB,{default}", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    names = {f"{family}-{size // 1024}KiB" for family in ("hetps", "bare") for size in (64 * 1024, default)}
    assert set(results["systems"]) == names
    assert all(summary["n"] == 3 and summary["median"] > 0 for summary in results["systems"].values())
    # Against itself the default size is exactly as fast, round by round.
    for family in ("hetps", "bare"):
        assert results["speed_vs_default"][f"{family}-{default // 1024}KiB"]["median"] == 1.0
    assert results["command"].startswith("python -m benchmarks.chunk_size --smoke")


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--sizes", "8KiB"], "--sizes: a chunk of 8192 bytes"), (["--rounds", "0"], "must be at least 1")],
)
def test_wrong_options_exit_2_with_what_to_fix(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_refused(main, argv, message, tmp_path, capsys)
