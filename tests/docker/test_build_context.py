"""Every package the wheel installs reaches the image: let through .dockerignore and copied by the
Dockerfile (a package missing from either fails only at `make image`, minutes in)."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _installed_packages() -> list[str]:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted(pattern.rstrip("*") for pattern in patterns)


def test_the_wheel_installs_the_packages_this_test_knows() -> None:
    assert {"pscli", "psproto", "psserver", "psworker", "pstasks", "pstools"} <= set(_installed_packages())


def test_every_installed_package_is_in_the_build_context_and_copied() -> None:
    allowed = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    for package in _installed_packages():
        assert f"!{package}/" in allowed, f".dockerignore keeps {package}/ out of the image's build context"
        assert f"COPY {package}/ {package}/" in dockerfile, f"docker/Dockerfile does not copy {package}/"
