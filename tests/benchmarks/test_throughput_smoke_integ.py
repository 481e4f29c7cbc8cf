"""``benchmarks.throughput --smoke``: every section runs once on a tiny model and writes the JSON the docs read.

Not a timing test: it checks that the servers, the bare gRPC ceiling, the torch.distributed.rpc
peer, the worker processes and the rule loop all work together and report what they should.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from benchmarks.harness.processes import cpu_seconds
from benchmarks.harness.step_systems import mover_groups, server_addresses, step_systems
from benchmarks.throughput import main
from psserver.core.rules import RULES

pytestmark = pytest.mark.integration

SUMMARY_KEYS = {"median", "q1", "q3", "min", "max", "n"}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One smoke run (the costly part) for every check below: the JSON it wrote."""
    out = tmp_path_factory.mktemp("throughput") / "throughput.json"
    returned = main(["--smoke", "--out", str(out)])
    written: dict[str, Any] = json.loads(out.read_text())
    assert written["targets"] == json.loads(json.dumps(returned["targets"]))
    return written


def test_smoke_run_writes_every_section(results: dict[str, Any]) -> None:
    assert {"date", "machine", "settings", "steps", "load", "apply", "memory", "targets"} <= set(results)


def test_every_step_system_is_timed_and_compared(results: dict[str, Any]) -> None:
    steps = results["steps"]["tiny"]
    assert set(steps["systems"]) == {spec.name for spec in step_systems()}
    for system in steps["systems"].values():
        assert set(system["step_ms"]) == SUMMARY_KEYS
        assert system["step_ms"]["n"] == 2 and system["step_ms"]["median"] > 0
        assert system["steps_per_s"] > 0
        used = system["cpu_ms_per_step"]
        assert used["client"] > 0 and used["server"] >= 0 and used["busy_cores"] > 0
    assert "hetps-1shard-bf16 vs peer-torch-rpc-fp32" in steps["speed_ratios"]
    assert "hetps-2shard-fp32 vs bare-2shard-fp32" in steps["speed_ratios"]
    assert "hetps-1shard-fp32 vs peer-torch-rpc-default-fp32" in steps["speed_ratios"]
    assert "hetps-1shard-int8push-bf16pull vs bare-1shard-int8push-bf16pull" in steps["speed_ratios"]
    assert "bare-1shard-int8push-bf16pull vs peer-torch-rpc-fp32" in steps["speed_ratios"]


def test_the_limits_split_hetps_distance_from_the_bare_mover(results: dict[str, Any]) -> None:
    # The bare mover doing the step's arithmetic splits hetps's distance from the bare one.
    steps = results["steps"]["tiny"]
    limits = results["limits"]["tiny"]
    assert set(limits) == {"1shard-fp32", "1shard-bf16", "2shard-fp32", "2shard-bf16", "1shard-int8push-bf16pull"}
    for row, ratios in limits.items():
        assert ratios["hetps vs arith"] == steps["speed_ratios"][f"hetps-{row} vs arith-{row}"]["median"] > 0
        assert ratios["arith vs bare"] == steps["speed_ratios"][f"arith-{row} vs bare-{row}"]["median"] > 0
        assert set(ratios["out_of_line"]) <= {f"bare-{row}", f"arith-{row}", f"overlap-{row}", "peer-torch-rpc-fp32"}
        # Applying span by span as the reply goes out is measured for one shard.
        overlap = steps["speed_ratios"].get(f"overlap-{row} vs arith-{row}", {}).get("median")
        assert ratios["overlap vs arith"] == overlap and (overlap is None) == row.startswith("2shard")
        assert all(f"tiny:{name}" in results["validity"]["out_of_line"] for name in ratios["out_of_line"])
    # The baselines were checked.
    validity = results["validity"]
    assert {check["check"] for check in validity["checks"]} == {"repeats", "ceiling"}
    assert validity["valid"] == all(check["ok"] for check in validity["checks"])


def test_concurrent_workers_and_rules_run_without_errors(results: dict[str, Any]) -> None:
    load = results["load"]["tiny"]
    assert load["workers"] == 2 and load["errors"] == 0 and load["aggregate_steps_per_s"] > 0
    assert results["gap_aware_load"]["errors"] == 0
    # The memory section read the loaded server's peak after the load.
    assert "load" in results["memory"]["servers"]["hetps-tiny-1shard"]["peak_rss_mb_after"]

    rules = results["apply"]["rules"]
    assert set(rules) == set(RULES)
    assert all("error" not in entry and entry["finite"] for entry in rules.values()), rules
    assert rules["momentum"]["vs_fused_sgd"]["median"] > 0


def test_every_server_kind_reports_its_memory(results: dict[str, Any]) -> None:
    servers = results["memory"]["servers"]
    assert {entry["kind"] for entry in servers.values()} == {"hetps", "bare", "peer"}
    gap_aware = next(entry for entry in servers.values() if entry.get("rule") == "gap-aware")
    assert gap_aware["snapshots_mb"] > 0 and gap_aware["rule_state_mb"] > 0
    assert all(entry["peak_rss_mb"] > 0 for entry in servers.values())


def test_targets_cover_every_section(results: dict[str, Any]) -> None:
    names = [target["target"] for target in results["targets"]]
    assert any("vs torch.rpc peer" in name for name in names)
    assert any("vs bare gRPC" in name for name in names)
    assert any("apply vs fused SGD" in name for name in names)
    assert any(name.startswith("peak RSS") for name in names)
    by_name = {target["target"]: target for target in results["targets"]}
    int8 = by_name["tiny step, 1 shard, int8 push + bf16 pull vs torch.rpc peer fp32"]
    assert int8["threshold"] == 1.5 and "the bare mover moving the same bytes" in int8["detail"]
    moved = by_name["tiny bytes per step, int8 push + bf16 pull vs fp32"]
    # Values are a quarter of fp32's and pulls half, plus a scale per block of 4,096 values.
    assert moved["measured"] == pytest.approx(0.375, abs=0.002) and moved["pass"]
    assert "tiny step 1shard-int8push-bf16pull vs bare gRPC" in by_name
    assert all(isinstance(target["pass"], bool) for target in results["targets"])
    assert not any(target["pass"] and target.get("invalid") for target in results["targets"])


def test_cpu_seconds_counts_the_cpu_a_process_spends() -> None:
    before = cpu_seconds(os.getpid())
    started = time.process_time()
    while time.process_time() - started < 0.3:
        pass
    # Clock-tick resolution (10 ms at most): 0.3 s of work shows as at least 0.2 s.
    assert cpu_seconds(os.getpid()) - before >= 0.2


def test_each_system_is_charged_the_cpu_of_its_own_servers() -> None:
    hetps = {
        model: {
            ("hetps", 1): [f"{model}-1"],
            ("hetps", 2): [f"{model}-2a", f"{model}-2b"],
            ("streams", 1): [f"{model}-s"],
        }
        for model in ("resnet18", "small")
    }
    movers = {("bare", 1): ["b1"], ("bare", 2): ["b2a", "b2b"], ("arith", 1): ["a1"], ("overlap", 1): ["o1"]}
    by_name = {spec.name: spec for spec in step_systems()}
    for model, servers in hetps.items():
        assert server_addresses(by_name["hetps-1shard-fp32"], model, hetps, movers) == servers[("hetps", 1)]
        assert server_addresses(by_name["hetps-2shard-bf16"], model, hetps, movers) == servers[("hetps", 2)]
        assert server_addresses(by_name["streams-1shard-int8push-bf16pull"], model, hetps, movers) == [f"{model}-s"]
        assert server_addresses(by_name["streams-1shard-fp32"], model, hetps, movers) == [f"{model}-s"]
        assert server_addresses(by_name["bare-1shard-bf16"], model, hetps, movers) == ["b1"]
        assert server_addresses(by_name["bare-2shard-fp32"], model, hetps, movers) == ["b2a", "b2b"]
        assert server_addresses(by_name["arith-1shard-int8push-bf16pull"], model, hetps, movers) == ["a1"]
        assert server_addresses(by_name["overlap-1shard-bf16"], model, hetps, movers) == ["o1"]
        assert server_addresses(by_name["peer-torch-rpc-fp32"], model, hetps, movers) == ["peer"]
        assert server_addresses(by_name["peer-torch-rpc-default-fp32"], model, hetps, movers) == ["peer-default"]


def test_every_kind_of_mover_has_servers_arranged_like_hetps() -> None:
    specs = step_systems()
    groups = mover_groups(specs)
    assert groups == [("bare", 1), ("bare", 2), ("arith", 1), ("arith", 2), ("overlap", 1)]
    # As many rows share a mover's server as share hetps's with the same shards, so each server
    # idles as long between its steps.
    hetps_rows = {shards: sum(s.kind == "hetps" and s.shards == shards for s in specs) for shards in (1, 2)}
    for variant in ("streams",):
        assert sum(s.kind == variant for s in specs) == hetps_rows[1], variant
    for kind, shards in groups:
        rows = sum(s.kind == kind and s.shards == shards for s in specs)
        assert rows == hetps_rows[shards], (kind, shards)
