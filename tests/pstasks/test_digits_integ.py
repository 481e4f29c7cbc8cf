"""Loading the digits task imports no scikit-learn (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys


def test_loading_the_task_does_not_import_scikit_learn() -> None:
    code = "import sys; from pstasks.tasks import load_task; load_task('digits'); print('sklearn' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
