"""The measurement scripts that run processes, each run alone: ``rule_apply --smoke`` and ``server_memory``."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.rule_apply import main as rule_apply
from psserver.core.rules import RULES


def test_rule_apply_alone_measures_every_rule_and_judges_its_targets(tmp_path: Path) -> None:
    out = tmp_path / "rule_apply.json"
    returned = rule_apply(["--smoke", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["targets"] == json.loads(json.dumps(returned["targets"]))
    assert results["command"] == f"python -m benchmarks.rule_apply --smoke --out {out}"
    assert set(results["apply"]["rules"]) == set(RULES)
    assert [target["target"] for target in results["targets"]] == [
        "momentum apply vs fused SGD (time)",
        "gap-aware apply vs fused SGD (time)",
    ]


def test_server_memory_alone_passes_its_server_config_on_and_counts_what_the_servers_refused(tmp_path: Path) -> None:
    from benchmarks.server_memory import main as server_memory

    out = tmp_path / "server_memory.json"
    config = tmp_path / "server.toml"
    config.write_text("[shard]\nmax_receiving_pushes = 1\n")
    server_memory(["--smoke", "--server-config", str(config), "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["server_config"] == {"shard": {"max_receiving_pushes": 1}}
    for load in results["asgd_load"].values():
        assert load["errors"] == 0 and load["aggregate_steps_per_s"] > 0
        assert all(count > 0 for count in load["refused"].values())
        assert set(load["refused"]) <= {"limit_reached"}
