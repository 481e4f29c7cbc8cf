"""Security flags that cannot work exit 2 naming what to fix, before anything binds or connects:
``psserver serve``'s TLS and token flags, and a worker's client certificate without its CA."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from psserver.cli import main as psserver_main
from pstasks.cli import main as psworker_main
from tests.pki import Pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("security") / "pki")


@pytest.mark.parametrize(
    ("flags", "hint"),
    [
        (lambda pki, empty: ["--tls-cert", str(pki.server[0])], "--tls-key"),
        (lambda pki, empty: ["--tls-client-ca", str(pki.ca1)], "--tls-cert"),
        (lambda pki, empty: ["--auth-token-file", str(empty)], "is empty"),
        (lambda pki, empty: ["--tls-cert", str(pki.server[1]), "--tls-key", str(pki.server[1])], "PEM"),
    ],
    ids=[
        "a certificate without its key",
        "a client CA without a certificate",
        "an empty token",
        "a key as certificate",
    ],
)
def test_serve_refuses_security_flags_that_cannot_work(
    pki: Pki, tmp_path: Path, flags: Callable[[Pki, Path], list[str]], hint: str
) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    result = CliRunner().invoke(psserver_main, ["serve", "--port", "0", "--metrics-port", "off", *flags(pki, empty)])
    assert result.exit_code == 2, result.output
    assert hint in result.output


def test_a_worker_certificate_without_the_ca_names_the_missing_key(pki: Pki, tmp_path: Path) -> None:
    cert, key = pki.server
    config = tmp_path / "worker.toml"
    config.write_text(f"[train.client.tls]\ncert = '{cert}'\nkey = '{key}'\n")
    result = CliRunner().invoke(psworker_main, ["train", "--server", "127.0.0.1:9", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert "train.client.tls.ca" in result.output
