"""The benchmarks' layout: small modules, each with a docstring, sharing code only through the harness.

A script may import the harness and the public names of the measurement scripts it runs (the
full ``throughput`` run does); nothing imports another module's ``_``-prefixed names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
MODULES = sorted(BENCHMARKS.rglob("*.py"))
MAX_LINES = 500


def _name(path: Path) -> str:
    return str(path.relative_to(BENCHMARKS.parent))


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_a_module_is_small_and_says_what_it_does(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    assert ast.get_docstring(ast.parse(text)), f"{_name(path)} opens with no docstring"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_imports_private_names_of_another(path: Path) -> None:
    private = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks"):
            modules = [*(node.module or "").split("."), *(alias.name for alias in node.names)]
            private += [name for name in modules if name.startswith("_") and name != "__future__"]
        elif isinstance(node, ast.Import):
            private += [alias.name for alias in node.names if alias.name.startswith("benchmarks._")]
    assert private == [], f"{_name(path)} imports private names {private}"


def test_the_harness_imports_no_script() -> None:
    scripts = {path.stem for path in BENCHMARKS.glob("*.py") if path.stem != "__init__"}
    for path in (BENCHMARKS / "harness").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                assert not (parts[0] == "benchmarks" and len(parts) > 1 and parts[1] in scripts), (
                    f"{_name(path)} imports the script {node.module}"
                )
