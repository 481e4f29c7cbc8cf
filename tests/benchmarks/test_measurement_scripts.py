"""Each measurement is a script of its own: it answers ``--help`` (test_measurement_scripts_integ.py
runs ``rule_apply --smoke`` and ``server_memory`` alone).

The scripts that start servers run, section by section, in ``throughput --smoke``
(test_throughput_smoke_integ.py); running each again on its own here would only repeat that.
"""

from __future__ import annotations

import importlib

import pytest

SCRIPTS = [
    "step_round_trip",
    "scale",
    "rule_apply",
    "server_memory",
    "throughput",
    "receive_window",
    "push_codec_accuracy",
    "chunk_size",
    "step_profile",
    "step_flags",
]


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_explains_its_options(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    script = importlib.import_module(f"benchmarks.{name}")
    with pytest.raises(SystemExit) as exited:
        script.main(["--help"])
    assert exited.value.code == 0
    assert f"python -m benchmarks.{name}" in capsys.readouterr().out
