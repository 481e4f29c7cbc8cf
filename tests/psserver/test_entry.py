"""``psserver`` without its extra installed: a one-line error naming the fix, not a traceback."""

from __future__ import annotations

import pytest

from psserver import entry


def test_a_missing_server_extra_is_named_with_its_install_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(entry, "find_spec", lambda name: None if name == "prometheus_client" else object())
    with pytest.raises(SystemExit) as exited:
        entry.require_server_extra()
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "psserver needs the server extra (prometheus_client missing): pip install 'hetps[server]'\n"
    )
