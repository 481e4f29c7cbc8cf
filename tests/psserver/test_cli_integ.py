"""``psserver``'s admin commands as processes: no torch or server code loaded, and an unreachable server."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from psserver.cli import main


def test_status_of_an_unreachable_server_is_a_clear_error() -> None:
    result = CliRunner().invoke(main, ["status", "--server", "127.0.0.1:1", "--timeout", "1"])
    assert result.exit_code == 1
    assert "127.0.0.1:1" in result.output and "UNAVAILABLE" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["status", "--help"],
        ["top", "--help"],
        ["checkpoint", "--help"],
        ["status", "--server", "127.0.0.1:9", "--timeout", "0.5"],  # runs, and fails: nothing listens there
        ["checkpoint", "--server", "127.0.0.1:9", "--timeout", "0.5"],
    ],
)
def test_the_admin_commands_start_without_torch_or_the_server(args: list[str]) -> None:
    code = (
        "import sys; from psserver.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'psserver.serve_cli', 'psserver.core.shard') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"
