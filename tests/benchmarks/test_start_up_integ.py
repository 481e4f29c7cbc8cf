"""``start_up``: every program in a fresh process, taking turns; the digits task against its scikit-learn
peer, an admin command against ``serve``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.start_up import PROGRAMS, main


def test_one_round_times_every_program_and_compares_the_task_with_its_peer(tmp_path: Path) -> None:
    out = tmp_path / "start_up.json"
    main(["--repeats", "1", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["command"] == f"python -m benchmarks.start_up --repeats 1 --out {out}"
    assert set(results["programs"]) == set(PROGRAMS)
    for program in results["programs"].values():
        assert program["wall_s"]["n"] == 1 and program["wall_s"]["median"] > 0
        assert program["cpu_s"]["median"] > 0
    assert results["task_vs_peer_cpu"]["median"] > 0
    assert 0 < results["admin_vs_serve_cpu"]["median"] < 1  # the admin command imports neither torch nor the server
    assert results["warm_vs_fresh_wall"]["median"] > 0


def test_no_rounds_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["--repeats", "0", "--out", str(tmp_path / "start_up.json")])
    assert refused.value.code == 2
