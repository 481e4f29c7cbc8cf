"""Rules own their logic: outside a rule's own modules, no source names its scheduling.

Delayed Nesterov's pull hold (``pull_grace``), DyLU's windows and GEM's reservation live in
their rules' modules under ``psserver/core/rules/`` and reach the shard through the rule's
hooks; the shard, its components, the metrics, ``psserver top``, the worker library and the
tools speak of them generically ("pull hold", "local steps assigned", "exclusive pull"). The
source is read as text (comments and docstrings too), never imported.

One name crosses the line on purpose: ``reserve``, the field of the wire's ``PullRequest``
(the contract, generated into ``psproto``), which the servicer reads and the worker library
carries from GEM's procedure to the request.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("psserver", "psworker", "pstools")
RULES = "psserver/core/rules"

# What names a rule's scheduling, and the modules of the rules that own it.
OWNED: dict[str, tuple[re.Pattern[str], frozenset[str]]] = {
    "pull_grace": (re.compile(r"pull_grace", re.IGNORECASE), frozenset({"diloco.py", "_pull_hold.py"})),
    "dylu": (re.compile(r"dylu", re.IGNORECASE), frozenset({"_windowed.py"})),
    "reservation": (re.compile(r"reserv", re.IGNORECASE), frozenset({"gem.py"})),
}
# The wire's PullRequest field, and the modules that carry it between the wire and a procedure.
WIRE_FIELD = re.compile(r"\breserve\b")
WIRE_FIELD_CARRIERS = frozenset(
    {
        "psserver/rpc/servicer.py",
        "psworker/client.py",
        "psworker/service.py",
        "psworker/procedures.py",
        "pstools/inprocess.py",
    }
)


def violations(root: Path) -> list[str]:
    """``path:line names what`` for every line under ``root`` that names a rule's scheduling outside its rule."""
    found = []
    for package in SCANNED:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            in_rules = relative.startswith(RULES + "/")
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                scanned = WIRE_FIELD.sub("", line) if relative in WIRE_FIELD_CARRIERS else line
                for what, (pattern, owners) in OWNED.items():
                    if pattern.search(scanned) and not (in_rules and path.name in owners):
                        found.append(f"{relative}:{number} names {what}: {line.strip()}")
    return found


def test_no_module_outside_a_rules_own_names_its_scheduling() -> None:
    assert violations(ROOT) == []


def test_the_check_finds_a_rule_named_in_the_shard_a_rule_or_the_worker(tmp_path: Path) -> None:
    def write(relative: str, text: str) -> None:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    for package in SCANNED:
        write(f"{package}/__init__.py", "")
    write(f"{RULES}/diloco.py", "pull_grace: float = 0.0\n")  # its owner: allowed
    write(f"{RULES}/gem.py", "self.reservation = NO_RESERVATION\n")
    write("psworker/client.py", "PullRequest(worker_id=1, reserve=reserve)\n")  # the wire field: allowed
    assert violations(tmp_path) == []
    write("psserver/core/shard.py", "if rule.options.dylu:\n")
    write(f"{RULES}/asgd.py", "# unlike pull_grace\n")  # another rule's module is not the owner
    write("psworker/client.py", "self._reservation = None\n")  # carriers pass the field, nothing more
    write("pstools/simulate.py", "    reservation_seconds=_NEVER_S,\n")
    assert sorted(violations(tmp_path)) == [
        f"{RULES}/asgd.py:1 names pull_grace: # unlike pull_grace",
        "psserver/core/shard.py:1 names dylu: if rule.options.dylu:",
        "pstools/simulate.py:1 names reservation: reservation_seconds=_NEVER_S,",
        "psworker/client.py:1 names reservation: self._reservation = None",
    ]
