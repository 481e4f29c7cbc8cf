"""Booleans written as text: how both sides read ``true``/``false`` from options and flags.

The server parses a rule's boolean options with it and the worker parses the procedure
options the server sends with it, so both accept exactly the same spellings.
"""

from __future__ import annotations

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def parse_bool(text: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case, spaces around ignored); ValueError otherwise."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{text!r} is not true or false (1/0, true/false, yes/no, on/off)")


def format_bool(value: bool) -> str:
    """The spelling the server sends: ``true`` or ``false``."""
    return "true" if value else "false"
