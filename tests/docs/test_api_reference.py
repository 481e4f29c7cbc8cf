"""docs/api.md against the code: the page fails here as soon as it drifts from the signatures.

Each ``### `dotted.name``` heading of the page names an importable object; the ```python block
right under it, when there is one, is that object's signature. Every documented parameter must
exist, in that order, of that kind and with that default; every parameter without a default must
be documented; and every public method and property of the interfaces the page covers must have
a heading, so a new one cannot go unmentioned.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import math
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "api.md"
ENTRY = re.compile(r"^### `([\w.]+)`\n(?:\n```python\n(.+?)\n```)?", re.MULTILINE | re.DOTALL)
# The task interface's module is named either way: a page naming one finds the object in the other.
TASK_MODULES = ("psworker.tasks", "psworker.task")
# The interfaces whose every public member the page must document.
COVERED = ("ParameterServerOptimizer", "PSClient", "ParameterService")


@dataclass(frozen=True)
class Entry:
    name: str
    signature: str | None


def entries() -> list[Entry]:
    return [Entry(name, block or None) for name, block in ENTRY.findall(PAGE.read_text())]


def import_module(name: str) -> ModuleType:
    candidates = TASK_MODULES if name in TASK_MODULES else (name,)
    for candidate in candidates:
        try:
            return importlib.import_module(candidate)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(f"none of {', '.join(candidates)} imports")


def resolve(dotted: str) -> tuple[ModuleType, list[Any]]:
    """The module of ``dotted`` and the chain of objects after it (class, then member)."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            module = import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        chain: list[Any] = []
        owner: Any = module
        for part in parts[cut:]:
            owner = inspect.getattr_static(owner, part)
            chain.append(owner)
        return module, chain
    raise AssertionError(f"{dotted}: no module of it imports")


def parse(block: str) -> ast.arguments:
    """The parameters of a signature line ``Name(params) -> ret`` (annotations kept, unread)."""
    tree = ast.parse(f"def {block.strip()}: ...")
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    return function.args


def same_default(documented: object, actual: object) -> bool:
    if isinstance(documented, float) and isinstance(actual, float) and math.isnan(documented):
        return math.isnan(actual)
    return documented is actual or documented == actual


def check_signature(entry: Entry, module: ModuleType, target: object) -> None:
    assert entry.signature is not None
    function = target.__func__ if isinstance(target, (staticmethod, classmethod)) else target
    actual = inspect.signature(function)  # type: ignore[arg-type]
    arguments = parse(entry.signature)
    positional = arguments.posonlyargs + arguments.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    documented = [(arg.arg, default, False) for arg, default in zip(positional, defaults, strict=True)]
    documented += [(arg.arg, d, True) for arg, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)]

    names = list(actual.parameters)
    positions = [names.index(name) if name in names else -1 for name, _, _ in documented]
    missing = [name for (name, _, _), at in zip(documented, positions, strict=True) if at < 0]
    assert not missing, f"{entry.name}: documented parameters {missing} do not exist; it takes {names}"
    assert positions == sorted(positions), f"{entry.name}: documented order {[d[0] for d in documented]}, code {names}"
    required = [p.name for p in actual.parameters.values() if p.default is inspect.Parameter.empty]
    undocumented = [name for name in required if name not in {d[0] for d in documented}]
    assert not undocumented, f"{entry.name}: required parameters {undocumented} are not documented"

    namespace = vars(module)
    for name, default, keyword_only in documented:
        parameter = actual.parameters[name]
        if keyword_only:
            assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, f"{entry.name}: {name} is not keyword-only"
        if default is None:
            assert parameter.default is inspect.Parameter.empty, f"{entry.name}: {name} has a default in the code"
            continue
        assert parameter.default is not inspect.Parameter.empty, f"{entry.name}: {name} has no default in the code"
        if isinstance(default, ast.Constant) and default.value is Ellipsis:
            continue  # a default made by a factory: only its presence is documented
        value = eval(compile(ast.Expression(default), PAGE.name, "eval"), dict(namespace))
        assert same_default(value, parameter.default), (
            f"{entry.name}: {name} defaults to {parameter.default!r} in the code, {ast.unparse(default)} on the page"
        )


ENTRIES = entries()


def test_the_page_documents_the_three_interfaces() -> None:
    documented = {entry.name.rsplit(".", 1)[-1] for entry in ENTRIES}
    assert set(COVERED) <= documented
    assert "Task" in documented
    assert sum(entry.signature is not None for entry in ENTRIES) >= 20


@pytest.mark.parametrize("entry", ENTRIES, ids=[entry.name for entry in ENTRIES])
def test_each_documented_name_exists_with_its_signature(entry: Entry) -> None:
    module, chain = resolve(entry.name)
    if entry.signature is not None:
        check_signature(entry, module, chain[-1])


@pytest.mark.parametrize("interface", COVERED)
def test_every_public_member_of_an_interface_is_documented(interface: str) -> None:
    entry = next(entry for entry in ENTRIES if entry.name.endswith(f".{interface}"))
    _, chain = resolve(entry.name)
    members = {
        name
        for name, value in vars(chain[-1]).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }
    documented = {e.name.rsplit(".", 1)[-1] for e in ENTRIES if e.name.startswith(f"{entry.name}.")}
    assert members <= documented, f"{interface}: {sorted(members - documented)} have no heading in docs/api.md"
