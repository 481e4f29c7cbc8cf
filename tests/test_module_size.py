"""One room per job: no hand-written module of the packages or the benchmarks grows past 500 lines.

A module that needs more holds a second job; split it where that job begins. Generated
protobuf code is exempt.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("psproto", "psserver", "psworker", "pstools", "benchmarks")
MAX_LINES = 500


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if not p.name.endswith(("_pb2.py", "_pb2_grpc.py")))


def _over_limit(modules: list[Path]) -> dict[str, int]:
    """Each module over the limit, by name, with its line count."""
    counts = {
        p.name if not p.is_relative_to(ROOT) else str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for p in modules
    }
    return {name: n for name, n in counts.items() if n > MAX_LINES}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_the_limit(package: str) -> None:
    modules = _modules(package)
    assert modules, f"no modules under {package}/"
    assert _over_limit(modules) == {}, f"modules over {MAX_LINES} lines: split them by job"


def test_the_check_sees_a_long_module(tmp_path: Path) -> None:
    at_limit, over = tmp_path / "at_limit.py", tmp_path / "over.py"
    at_limit.write_text("x = 1\n" * MAX_LINES)
    over.write_text("x = 1\n" * (MAX_LINES + 1))
    assert _over_limit([at_limit, over]) == {"over.py": MAX_LINES + 1}
