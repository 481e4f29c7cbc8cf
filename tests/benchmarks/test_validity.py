"""The baseline checks of ``benchmarks.harness.validity`` on synthetic numbers, and the INVALID they lead to."""

from __future__ import annotations

import math

from rich.console import Console

from benchmarks.harness.report import print_targets, print_validity, result_word, target
from benchmarks.harness.validity import (
    PEER_VS_BARE_BOUNDS,
    REPEAT_SPREAD_BOUND,
    ceiling_check,
    invalidate,
    repeat_spread_check,
    summarize_checks,
)


def _passing_target(system: str = "resnet18:peer-torch-rpc-fp32") -> tuple[dict[str, object], list[str]]:
    summary = {"median": 1.2, "q1": 1.1, "q3": 1.3, "min": 1.0, "max": 1.4, "n": 3}
    return target("hetps vs peer", summary, 0.8, True), [system]


def test_a_baseline_whose_repeats_agree_holds_still() -> None:
    check = repeat_spread_check("resnet18:bare-1shard-fp32", [41.3, 51.2, 48.2])
    assert check["ok"] and check["why"] == ""
    assert math.isclose(check["value"], 51.2 / 41.3)


def test_a_peer_still_warming_up_is_out_of_line_with_its_own_repeats() -> None:
    # The peer of a quick run: 297.7 ms in its first repeat, then 55.8 and 55.4.
    check = repeat_spread_check("resnet18:peer-torch-rpc-fp32", [297.7, 55.8, 55.4])
    assert not check["ok"]
    assert check["systems"] == ["resnet18:peer-torch-rpc-fp32"]
    assert "5.37x" in check["why"]


def test_the_spread_bound_is_inclusive_and_configurable() -> None:
    assert repeat_spread_check("s", [10.0, 10.0 * REPEAT_SPREAD_BOUND])["ok"]
    assert not repeat_spread_check("s", [10.0, 12.0], bound=1.1)["ok"]


def test_no_usable_repeats_is_out_of_line() -> None:
    assert not repeat_spread_check("s", [])["ok"]
    assert not repeat_spread_check("s", [0.0, 1.0])["ok"]
    assert not ceiling_check("p", "b", [], [])["ok"]


def test_a_peer_near_the_bare_mover_is_in_line() -> None:
    # Full runs: the peer took 0.79x (39.6 vs 50.4 ms) to 1.2x the bare mover's time.
    assert ceiling_check("p", "b", [39.6, 40.0, 41.0], [50.4, 50.0, 52.0])["ok"]
    assert ceiling_check("p", "b", [57.5, 60.0], [50.0, 50.0])["ok"]


def test_a_peer_far_slower_than_the_bare_mover_is_out_of_line() -> None:
    # Issue 22: the peer at 193.7 ms against the bare mover's 63.7 ms.
    check = ceiling_check("p", "b", [193.7, 190.0, 200.0], [63.7, 60.0, 65.0])
    assert not check["ok"]
    assert check["value"] > PEER_VS_BARE_BOUNDS[1]
    assert "slower than the bare byte mover" in check["why"]


def test_a_peer_far_faster_than_the_bare_mover_is_out_of_line() -> None:
    check = ceiling_check("p", "b", [20.0, 21.0, 19.0], [50.0, 52.0, 49.0])
    assert not check["ok"]
    assert check["value"] < PEER_VS_BARE_BOUNDS[0]
    assert "faster than the bare byte mover" in check["why"]


def test_the_ceiling_check_takes_the_median_of_per_repeat_ratios() -> None:
    # One repeat caught by another job does not decide it; two of three do.
    assert ceiling_check("p", "b", [50.0, 300.0, 52.0], [50.0, 50.0, 50.0])["ok"]
    assert not ceiling_check("p", "b", [300.0, 300.0, 52.0], [50.0, 50.0, 50.0])["ok"]


def test_a_target_against_an_out_of_line_baseline_is_invalid_never_pass() -> None:
    validity = summarize_checks(
        [
            repeat_spread_check("resnet18:peer-torch-rpc-fp32", [297.7, 55.8, 55.4]),
            repeat_spread_check("resnet18:bare-1shard-fp32", [41.3, 51.2, 48.2]),
        ]
    )
    assert not validity["valid"]
    assert validity["out_of_line"] == ["resnet18:peer-torch-rpc-fp32"]
    judged, depends_on = _passing_target()
    assert judged["pass"]
    invalid = invalidate(judged, depends_on, validity)
    assert invalid["pass"] is False
    assert result_word(invalid) == "INVALID"
    assert invalid["invalid"] and invalid["invalid"][0].startswith("repeats: ")
    # A target judged against the baseline that held still keeps its result.
    other, bare = _passing_target("resnet18:bare-1shard-fp32")
    assert result_word(invalidate(other, bare, validity)) == "PASS"


def test_the_tables_say_invalid_and_why() -> None:
    validity = summarize_checks([ceiling_check("resnet18:peer", "resnet18:bare", [193.7], [63.7])])
    judged, depends_on = _passing_target("resnet18:peer")
    console = Console(width=200, record=True)
    print_validity(validity, console)
    print_targets([invalidate(judged, depends_on, validity)], console)
    text = console.export_text()
    assert "INVALID" in text and "PASS" not in text
    assert "slower than the bare byte mover" in text
