"""docs/troubleshooting.md names every refusal reason the server can send, with its gRPC code.

A reason added to psproto.reasons without a row on the page fails here, and so does a row whose
status code is not the one psserver.rpc.status_codes sends it with.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from psproto.reasons import Reason
from psserver.rpc.status_codes import STATUS_CODES

PAGE = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"
ROW = re.compile(r"^\| `([A-Z_]+)` \| `([A-Z_]+)` \|", re.MULTILINE)


def rows() -> dict[str, str]:
    """The reasons table: reason -> the status code the page gives it."""
    return dict(ROW.findall(PAGE.read_text()))


@pytest.mark.parametrize("reason", list(Reason), ids=[reason.value for reason in Reason])
def test_every_reason_has_a_row_with_its_status_code(reason: Reason) -> None:
    table = rows()
    assert reason.value in table, f"docs/troubleshooting.md has no row for {reason.value}"
    assert table[reason.value] == STATUS_CODES[reason].name, (
        f"{reason.value}: the page says {table[reason.value]}, the server sends {STATUS_CODES[reason].name}"
    )


def test_the_table_names_no_reason_the_server_does_not_have() -> None:
    assert set(rows()) == {reason.value for reason in Reason}
