"""Accuracy with 8-bit pushes: the Fashion-MNIST CNN trained with fp32 pushes and with int8 pushes.

    python -m benchmarks.push_codec_accuracy [--steps 2500] [--seeds 0,1] [--rules asgd:0.08,...]
        [--variants fp32,int8,int8-no-ef] [--out benchmarks/results/push_codec_accuracy.json]

Each run is ``psworker simulate`` (pstools.simulate): 4 workers of speeds 1:1:2:4 in virtual time
against the server's own shard and rule, every push going through psworker.push_encoding and the
shard's chunk decoding exactly as over the wire (``--push-dtype int8``: the 8-bit block codec with
the worker's error feedback). The virtual time makes fp32 and int8 runs of one seed see the same
batches in the same order and the same number of updates, so their accuracies pair up. The
learning rates are the Fashion-MNIST sweep's (docs/benchmarks.md). Target: with 8-bit
pushes, the final test accuracy within 0.3 points of fp32's for asgd, momentum and gap-aware.
``--variants`` adds ``int8-no-ef`` (8-bit pushes without error feedback), compared with fp32 the
same way, to see what the residual does for each rule. Prints one table and the targets; writes
every run as JSON.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.harness.report import prepare_output, print_targets, write_results
from pstools.simulate import SimConfig, SpeedModel, simulate

NAME = "push_codec_accuracy"
# The learning rates of docs/benchmarks.md's Fashion-MNIST sweep, 1:1:2:4.
DEFAULT_RULES = "asgd:0.08,momentum:0.005,gap-aware:0.32"
# A variant: the push dtype and whether the worker carries its quantisation error forward.
VARIANTS = {"fp32": ("fp32", True), "int8": ("int8", True), "int8-no-ef": ("int8", False)}
DEFAULT_VARIANTS = "fp32,int8"
TARGET_POINTS = 0.3


def _parse_rules(text: str) -> list[tuple[str, str]]:
    rules = []
    for item in text.split(","):
        rule, _, lr = item.partition(":")
        if not rule or not lr:
            raise argparse.ArgumentTypeError(f"{item!r} is not RULE:LR")
        rules.append((rule, lr))
    return rules


def _parse_variants(text: str) -> list[str]:
    variants = text.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if "fp32" not in variants:
        raise argparse.ArgumentTypeError("the variants must include fp32: every other one is compared with it")
    return variants


def run_one(rule: str, lr: str, variant: str, seed: int, steps: int, task: str) -> dict[str, Any]:
    dtype, error_feedback = VARIANTS[variant]
    config = SimConfig(
        rule=rule,
        options={"lr": lr},
        workers=4,
        speeds=SpeedModel.parse("1:1:2:4", 0.05),
        task=task,
        steps=steps,
        eval_every=steps,
        seed=seed,
        push_dtype=dtype,
        error_feedback=error_feedback,
    )
    result = simulate(config)
    return {
        "rule": rule,
        "lr": lr,
        "variant": variant,
        "push_dtype": dtype,
        "error_feedback": error_feedback,
        "seed": seed,
        "test_accuracy": result.test_accuracy,
        "test_loss": result.test_loss,
        "updates": result.clock,
        "diverged": result.diverged,
        "wall_s": result.wall_s,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2500, help="gradients of all workers together, per run")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    parser.add_argument("--rules", type=_parse_rules, default=_parse_rules(DEFAULT_RULES), help="RULE:LR,...")
    parser.add_argument("--task", default="fashion", help="a built-in task (tests use digits)")
    parser.add_argument(
        "--variants",
        type=_parse_variants,
        default=_parse_variants(DEFAULT_VARIANTS),
        help=f"comma-separated, of: {', '.join(VARIANTS)}",
    )
    parser.add_argument("--out", type=Path, default=Path(f"benchmarks/results/{NAME}.json"))
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    console, _ = prepare_output(args.out)
    started = time.perf_counter()
    runs = []
    for rule, lr in args.rules:
        for seed in seeds:
            for variant in args.variants:
                with console.status(f"{rule} lr {lr}, {variant} pushes, seed {seed}"):
                    runs.append(run_one(rule, lr, variant, seed, args.steps, args.task))
                # One line per run as it ends: a long run shows its progress in a log file too.
                console.print(
                    f"{rule} lr {lr}, {variant} pushes, seed {seed}: accuracy {runs[-1]['test_accuracy']:.4f} "
                    f"after {runs[-1]['updates']} updates ({runs[-1]['wall_s']:.0f} s)"
                )
    results: dict[str, Any] = {"task": args.task, "steps": args.steps, "seeds": seeds, "runs": runs}
    results["targets"] = _targets(runs, args.rules, args.variants)
    _print_table(runs, args.rules, args.variants, console)
    print_targets(results["targets"], console)
    results["wall_seconds"] = time.perf_counter() - started
    write_results(NAME, argv, results, args.out, console)
    return results


def _accuracies(runs: list[dict[str, Any]], rule: str, variant: str) -> list[float]:
    return [r["test_accuracy"] for r in runs if r["rule"] == rule and r["variant"] == variant]


def _targets(runs: list[dict[str, Any]], rules: list[tuple[str, str]], variants: Sequence[str]) -> list[dict[str, Any]]:
    targets = []
    for rule, _ in rules:
        for variant in (v for v in variants if v != "fp32"):
            targets.append(_gap_target(runs, rule, variant))
    return targets


def _gap_target(runs: list[dict[str, Any]], rule: str, variant: str) -> dict[str, Any]:
    # Points lost against fp32, seed by seed (the runs pair up).
    gaps = [
        100 * (fp32 - other)
        for fp32, other in zip(_accuracies(runs, rule, "fp32"), _accuracies(runs, rule, variant), strict=True)
    ]
    mean_gap = statistics.fmean(gaps)
    return {
        "target": f"{rule}: fp32 − {variant} final accuracy (points, mean over seeds)",
        "measured": mean_gap,
        "min": min(gaps),
        "max": max(gaps),
        "threshold": TARGET_POINTS,
        "comparison": "<=",
        "pass": bool(mean_gap <= TARGET_POINTS),
        "detail": "",
    }


def _print_table(
    runs: list[dict[str, Any]], rules: list[tuple[str, str]], variants: Sequence[str], console: Console
) -> None:
    table = Table(title="Final test accuracy, fp32 and int8 pushes (psworker simulate, 4 workers 1:1:2:4)")
    for column in ("rule", "lr", "push dtype", "accuracy per seed", "mean", "updates"):
        table.add_column(column, justify="left" if column in ("rule", "push dtype") else "right")
    for rule, lr in rules:
        for variant in variants:
            mine = [r for r in runs if r["rule"] == rule and r["variant"] == variant]
            accuracies = [r["test_accuracy"] for r in mine]
            table.add_row(
                rule,
                lr,
                variant,
                ", ".join(
                    f"{a:.4f}" + (" (diverged)" if r["diverged"] else "") for a, r in zip(accuracies, mine, strict=True)
                ),
                f"{statistics.fmean(accuracies):.4f}",
                ", ".join(str(r["updates"]) for r in mine),
            )
    console.print(table)


if __name__ == "__main__":
    main()
