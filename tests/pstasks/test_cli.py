"""``psworker train``'s connection flags: wrong values are refused before anything connects."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pstasks.cli import main


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--keepalive-seconds", "0.5", "0.5 is not in the range x>=1.0"),
        ("--keepalive-seconds", "soon", "'soon' is not a valid float"),
        ("--min-transfer-rate", "0", "0 is not in the range x>0"),
        ("--min-transfer-rate", "-1", "-1.0 is not in the range x>0"),
        ("--chunk-size", "1KiB", "a chunk of 1024 bytes is below the smallest, 65536 (64KiB)"),
        ("--chunk-size", "big", "give a whole number of bytes, KiB or MiB (e.g. 1MiB)"),
        ("--chunk-size", "40MiB", "above half the largest message"),
        ("--encode-on", "gpu", "'gpu' is not one of 'device', 'host'"),
    ],
)
def test_a_wrong_connection_flag_is_refused_with_its_name(flag: str, value: str, says: str) -> None:
    # 127.0.0.1:9 (discard) is never contacted: the flags are checked first.
    result = CliRunner().invoke(main, ["train", "--server", "127.0.0.1:9", flag, value])
    assert result.exit_code == 2
    assert flag in result.output and says in result.output, result.output


def test_the_connection_flags_are_documented() -> None:
    result = CliRunner().invoke(main, ["train", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "--keepalive-seconds" in text and "noticed within 1.5 times this" in text
    assert "--min-transfer-rate" in text and "MiB/s a call's payload is given in its deadline" in text


@pytest.mark.parametrize("flags", [["--pull-dtype", "int8"], ["--wire-dtype", "int8"]])
def test_int8_pulls_are_a_usage_error(flags: list[str]) -> None:
    result = CliRunner().invoke(main, ["train", "--server", "127.0.0.1:9", *flags])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert flags[0] in text and "is for pushes only" in text and "--push-dtype int8 --pull-dtype bf16" in text, text


def test_the_dtype_flags_are_documented() -> None:
    text = " ".join(CliRunner().invoke(main, ["train", "--help"]).output.split())
    for flag in (
        "--wire-dtype",
        "--push-dtype",
        "--pull-dtype",
        "--chunk-size",
        "--error-feedback / --no-error-feedback",
        "--encode-on [device|host]",
    ):
        assert flag in text
