"""A benchmark script given a wrong option: exit status 2, what to fix on stderr, no results written."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest


def assert_refused(
    main: Callable[[list[str]], object],
    argv: Sequence[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.json"
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--out", str(out)])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
