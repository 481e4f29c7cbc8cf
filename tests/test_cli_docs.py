"""docs/cli.md and docs/configuration.md are what scripts/gen_cli_docs.py writes from the code."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "scripts" / "gen_cli_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["docs/cli.md", "docs/configuration.md"])
def test_the_page_matches_the_code(page: str) -> None:
    written = _generator().pages()[ROOT / page]
    assert (ROOT / page).read_text() == written, f"{page} drifted: run {sys.executable} scripts/gen_cli_docs.py"


def test_every_command_every_option_and_every_key_is_listed() -> None:
    from psserver.app import ServerConfig
    from psserver.cli import main as psserver_main
    from psserver.serve_cli import serve
    from pstools.cli import main as psworker_main

    cli = (ROOT / "docs" / "cli.md").read_text()
    for program, group in (("psserver", psserver_main), ("psworker", psworker_main)):
        for name in group.list_commands(None):  # type: ignore[arg-type]
            assert f"## `{program} {name}`" in cli
    for option in serve.params:
        assert f"`{option.opts[0]}" in cli
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    for key in ("shard.receive_buffers", "transport.receive_window_bytes", "allocator.arenas", "checkpoints.keep"):
        assert f"| `{key}` |" in configuration
    # Every key has its meaning: no empty last cell.
    assert "|  |\n" not in configuration
    assert set(ServerConfig.__dataclass_fields__) <= {
        line.split("`")[1] for line in configuration.splitlines() if line.startswith("| `")
    }
