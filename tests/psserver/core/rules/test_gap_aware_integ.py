"""Gap-Aware's numba kernel is loaded only by a server that applies gap-aware (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys


def test_only_a_gap_aware_server_loads_numba() -> None:
    """numba costs a server about 150 MB: importing the rules or building another rule must not load it."""
    script = (
        "import sys\n"
        "from psserver.core.rules import RULES, RuleSpec\n"
        "for name in sorted(RULES):\n"
        "    if name != 'gap-aware':\n"
        "        RuleSpec.parse(name, {}).build(8)\n"
        "assert 'numba' not in sys.modules, 'numba loaded without gap-aware'\n"
        "RuleSpec.parse('gap-aware', {}).build(8)\n"
        "assert 'numba' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
