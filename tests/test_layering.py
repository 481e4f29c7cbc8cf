"""The dependency direction of DESIGN.md, checked on the source (parsed, never imported).

``psproto`` <- ``psserver`` and ``psproto`` <- ``psworker`` <- ``pstasks``, and ``pstools`` above
them; ``pscli`` (what the command lines share) under all of them, importing none. The server
never imports the worker, the worker never imports the server, the tasks or the tools, the tasks
never import the server, and there are no exceptions. The server's core
(shard state, rules, consistency) imports neither grpc nor the wire (generated messages, wire
bytes). What the client library imports from outside the standard library is in the base
install (no extras), so ``pip install hetps`` gives a working client without scikit-learn.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


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


def test_the_server_core_never_imports_the_wire() -> None:
    found = _violations("psserver/core", ("psproto.v1", "psproto.wire"))
    assert found == [], "psserver/core builds no wire bytes: rpc/ injects the encoder"


def test_the_wire_contract_imports_neither_side() -> None:
    assert _violations("psproto", ("psserver", "psworker", "pstasks", "pstools")) == []


def test_the_command_line_package_imports_no_other_hetps_package() -> None:
    found = _violations("pscli", ("psproto", "psserver", "psworker", "pstasks", "pstools"))
    assert found == [], "pscli sits below both sides: click and the standard library only"


def test_the_server_never_imports_the_worker_the_tasks_or_the_tools() -> None:
    assert _violations("psserver", ("psworker", "pstasks", "pstools")) == []


def test_the_worker_never_imports_the_server_the_tasks_or_the_tools() -> None:
    found = _violations("psworker", ("psserver", "pstasks", "pstools"))
    assert found == [], "the worker rests on psproto alone; built-in tasks live in pstasks, both sides in pstools"


def test_the_tasks_never_import_the_server_or_the_tools() -> None:
    assert _violations("pstasks", ("psserver", "pstools")) == []


def test_nothing_imports_the_experiments() -> None:
    """Reproductions and races use everything (the benchmarks' harness too); nothing uses them."""
    packages = ("psproto", "psserver", "psworker", "pstasks", "pstools", "benchmarks")
    assert [line for package in packages for line in _violations(package, ("experiments",))] == []


_OURS = ("pscli", "psproto", "psserver", "psworker", "pstasks", "pstools", "benchmarks", "experiments", "tests")


def _base_requirements() -> set[str]:
    """The distributions ``pip install hetps`` brings, without extras (normalised names)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = (re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0] for requirement in project["dependencies"])
    return {name.lower().replace("_", "-") for name in names}


def test_the_client_library_needs_only_the_base_install() -> None:
    """Every third-party module psproto and psworker import comes with the base install: no extra
    (scikit-learn, prometheus-client, ...) is needed to import the client library."""
    base = _base_requirements()
    assert "scikit-learn" not in base, "scikit-learn belongs in the tasks extra"
    providers = packages_distributions()
    outside = sorted(
        {
            f"{path.relative_to(ROOT)}:{line} imports {name} ({', '.join(providers.get(top, ['no distribution']))})"
            for package in ("pscli", "psproto", "psworker")
            for path in _sources(package)
            for line, name in _imports(path)
            if (top := name.split(".")[0]) not in sys.stdlib_module_names
            and top not in _OURS
            and not {dist.lower().replace("_", "-") for dist in providers.get(top, [])} & base
        }
    )
    assert outside == [], "the client library imports what only an extra installs"


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
    assert "psserver.flags" in {name for _, name in _imports(ROOT / "pstools" / "cli.py")}  # inside `cluster`
