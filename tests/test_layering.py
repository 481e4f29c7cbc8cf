"""The dependency direction of DESIGN.md, checked on the source (parsed, never imported).

``psproto`` <- ``psserver`` and ``psproto`` <- ``psworker``: the server never imports the
worker, the worker never imports the server except in the tools that deliberately run both,
and the server's core (shard state, rules, consistency) never imports grpc.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# psworker modules that may import the server, and what each may import from it.
DELIBERATE_WORKER_TO_SERVER = {
    # `psworker cluster` is the local launcher: it runs the servers too, and checks the rule with
    # the server's own parser (and message) before starting them.
    "psworker.cli": ("psserver.cli",),
    # The simulator runs the server's own shard and rules in virtual time, in one process.
    "psworker.simulate": ("psserver.core",),
    # `psworker simulate` parses the rule with the server's parser, like `psworker cluster`.
    "psworker.sim_cli": ("psserver.cli",),
    # `psworker export --checkpoint` reads the server's checkpoint files offline (no server runs).
    "psworker.export": ("psserver.core.checkpoint",),
}


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """(line, absolute module) for every import in ``path``, at any depth (lazy ones too)."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            yield node.lineno, name
            # `from psserver import cli` imports psserver.cli.
            for alias in node.names:
                yield node.lineno, f"{name}.{alias.name}"


def _sources(package: str) -> list[Path]:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no sources under {package}/"
    return files


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _report(found: list[tuple[Path, int, str]]) -> list[str]:
    """One line per import statement (``from a import b`` is seen as both ``a`` and ``a.b``)."""
    lines: dict[tuple[Path, int], str] = {}
    for path, line, name in found:
        lines.setdefault((path, line), f"{path.relative_to(ROOT)}:{line} imports {name}")
    return list(lines.values())


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return _report(
        [
            (path, line, name)
            for path in _sources(package)
            for line, name in _imports(path)
            if any(_within(name, prefix) for prefix in forbidden)
        ]
    )


def test_the_server_core_never_imports_grpc() -> None:
    found = _report(
        [
            (path, line, name)
            for path in _sources("psserver/core")
            for line, name in _imports(path)
            if name.split(".")[0] == "grpc" or name.startswith("grpc_")
        ]
    )
    assert found == [], "psserver/core is pure torch; grpc belongs in psserver/rpc"


def test_the_wire_contract_imports_neither_side() -> None:
    assert _violations("psproto", ("psserver", "psworker")) == []


def test_the_server_never_imports_the_worker() -> None:
    assert _violations("psserver", ("psworker",)) == []


def test_the_worker_imports_the_server_only_where_it_deliberately_runs_both() -> None:
    found = []
    for path in _sources("psworker"):
        allowed = DELIBERATE_WORKER_TO_SERVER.get(_module_name(path), ())
        for line, name in _imports(path):
            if _within(name, "psserver") and not any(_within(name, prefix) for prefix in allowed):
                found.append((path, line, name))
    assert _report(found) == [], "the worker imports only psproto (shared client helpers live in psproto.security)"


@pytest.mark.parametrize("module", sorted(DELIBERATE_WORKER_TO_SERVER))
def test_every_exception_is_still_needed(module: str) -> None:
    """An exception whose module no longer imports the server is dropped from the list."""
    path = ROOT / (module.replace(".", "/") + ".py")
    assert any(_within(name, "psserver") for _, name in _imports(path)), f"{module} no longer imports psserver"


def test_the_walker_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The checks above are only as good as ``_imports``: it must see every way of importing."""
    source = tmp_path / "psworker" / "tools" / "thing.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "import grpc.aio\n"
        "from . import sibling\n"
        "from ..client import PSClient\n"
        "from psserver import cli\n"
        "def later():\n"
        "    import psserver.core.shard\n"
    )
    names = {name for _, name in _imports(source, tmp_path)}
    assert {"grpc.aio", "psworker.tools.sibling", "psworker.client", "psserver.cli", "psserver.core.shard"} <= names
    assert "psserver.cli" in {name for _, name in _imports(ROOT / "psworker" / "cli.py")}  # inside `cluster`
