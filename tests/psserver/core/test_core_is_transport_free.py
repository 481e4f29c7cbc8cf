"""psserver.core never builds wire bytes: no generated protobuf module, no psproto.wire, no grpc."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[3] / "psserver" / "core"
FORBIDDEN = ("psproto.v1", "psproto.wire", "grpc")


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_core_module_imports_the_wire_format() -> None:
    found = [
        f"{path.relative_to(CORE)} imports {name}"
        for path in sorted(CORE.rglob("*.py"))
        for name in _imported(path)
        if any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN)
    ]
    assert found == []


def test_no_core_module_is_over_500_lines() -> None:
    long = [path.name for path in CORE.rglob("*.py") if len(path.read_text().splitlines()) > 500]
    assert long == []
