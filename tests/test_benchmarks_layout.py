"""The layout of the benchmarks and the experiments: small modules, each with a docstring,
sharing code only through a harness.

A script may import a harness and the public names of the scripts it runs (the full
``throughput`` run does); nothing imports another module's ``_``-prefixed names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("benchmarks", "experiments")
MODULES = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))
MAX_LINES = 500


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_a_module_is_small_and_says_what_it_does(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    assert ast.get_docstring(ast.parse(text)), f"{_name(path)} opens with no docstring"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_imports_private_names_of_another(path: Path) -> None:
    private = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGES):
            modules = [*(node.module or "").split("."), *(alias.name for alias in node.names)]
            private += [name for name in modules if name.startswith("_") and name != "__future__"]
        elif isinstance(node, ast.Import):
            private += [alias.name for alias in node.names if alias.name.startswith(("benchmarks._", "experiments._"))]
    assert private == [], f"{_name(path)} imports private names {private}"


@pytest.mark.parametrize("package", PACKAGES)
def test_the_harness_imports_no_script(package: str) -> None:
    scripts = {path.stem for path in (ROOT / package).glob("*.py") if path.stem != "__init__"}
    for path in (ROOT / package / "harness").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                assert not (parts[0] == package and len(parts) > 1 and parts[1] in scripts), (
                    f"{_name(path)} imports the script {node.module}"
                )
