from __future__ import annotations

import os
import subprocess
import sys

from psproto import tuning


def test_missing_settings_are_wanted_unless_turned_off() -> None:
    assert tuning.wanted_environment({}) == tuning.MALLOC_SETTINGS
    for off in ("0", "false", "No", " OFF "):
        assert tuning.wanted_environment({tuning.DISABLE_VARIABLE: off}) == {}
    assert tuning.wanted_environment({tuning.DISABLE_VARIABLE: "1"}) == tuning.MALLOC_SETTINGS
    already = dict(tuning.MALLOC_SETTINGS)
    assert tuning.wanted_environment(already) == {}


def test_the_entry_point_re_executes_itself_with_the_settings() -> None:
    env = {k: v for k, v in os.environ.items() if k not in tuning.MALLOC_SETTINGS and k != tuning.DISABLE_VARIABLE}
    code = (
        "import os; from psproto.tuning import apply_malloc_tuning; apply_malloc_tuning(); "
        "print(os.environ['MALLOC_TOP_PAD_'])"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == tuning.MALLOC_SETTINGS["MALLOC_TOP_PAD_"]
    env[tuning.DISABLE_VARIABLE] = "0"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; from psproto.tuning import apply_malloc_tuning; apply_malloc_tuning(); "
            "print(os.environ.get('MALLOC_TOP_PAD_', 'unset'))",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == "unset"
