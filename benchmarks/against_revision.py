"""This tree's worker step against another revision's, in the same run: is hetps any slower than it was?

    python -m benchmarks.against_revision REV [--models small,resnet18] [--wire-dtype fp32]
        [--rounds 15] [--steps N] [--out benchmarks/results/against_revision.json]

REV is checked out into a temporary git worktree. For each model, both trees start a server and
a worker of their own (``benchmarks/harness/revision_step.py``: one ASGD shard on loopback, each
tree on its own defaults, through ``ParameterServerOptimizer``) and stay up; every round, in a
fresh random order, each takes ``--steps`` steps while the other idles. A round's ratio is the
revision's median step time over this tree's (> 1: this tree is faster); the table gives the
rounds' median and range, which a busy machine moves for both sides alike.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from rich.table import Table

from benchmarks.harness.models import MODELS
from benchmarks.harness.report import prepare_output, run_header, write_results
from benchmarks.harness.stats import summarize, verdict

REPO_ROOT = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).resolve().parent / "harness" / "revision_step.py"
# About a second of steps: a round's median of a few milliseconds' steps is noise otherwise.
STEPS_PER_ROUND = {"tiny": 300, "small": 200, "resnet18": 10}


class Side:
    """One tree's server and worker (a ``revision_step.py`` process), stepped on request."""

    def __init__(self, label: str, tree: Path, model: str, wire_dtype: str) -> None:
        self.label = label
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.process = subprocess.Popen(
            [sys.executable, str(DRIVER), json.dumps([shape for _, shape in MODELS[model]()]), wire_dtype],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.steps_ms: list[float] = []
        self.round_medians: list[float] = []
        if self._read() != "ready":
            raise SystemExit(f"{label}: the step driver did not start")

    def _read(self) -> str:
        stdout: IO[str] | None = self.process.stdout
        line = stdout.readline() if stdout is not None else ""
        if not line:
            raise SystemExit(f"{self.label}: the step driver exited ({self.process.wait()})")
        return line.strip()

    def run(self, steps: int) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{steps}\n")
        self.process.stdin.flush()
        times = json.loads(self._read())
        self.steps_ms += times
        self.round_medians.append(statistics.median(times))

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
        self.process.wait(60)


@contextmanager
def checked_out(revision: str) -> Iterator[Path]:
    """``revision`` in a temporary detached worktree of this repository, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="hetps-rev-") as parent:
        tree = Path(parent) / "tree"
        subprocess.run(
            ["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", "-q", str(tree), revision], check=True
        )
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(tree)], check=False)


def compare(model: str, revision_tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Both trees' steps on ``model``, interleaved round by round."""
    sides = [
        Side("revision", revision_tree, model, args.wire_dtype),
        Side("this tree", REPO_ROOT, model, args.wire_dtype),
    ]
    order = random.Random(0)
    try:
        for _ in range(args.rounds):
            for side in order.sample(sides, len(sides)):
                side.run(args.steps or STEPS_PER_ROUND.get(model, 20))
    finally:
        for side in sides:
            side.close()
    revision, current = sides
    ratios = [old / new for old, new in zip(revision.round_medians, current.round_medians, strict=True)]
    return {
        "model": model,
        "revision_step_ms": summarize(revision.steps_ms),
        "this_tree_step_ms": summarize(current.steps_ms),
        "speed_ratio_per_round": summarize(ratios),
        "verdict": verdict(summarize(ratios)),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="a git revision of this repository, e.g. a commit or a tag")
    parser.add_argument("--models", default="small,resnet18", help="comma-separated: small, resnet18, tiny")
    parser.add_argument("--wire-dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, help="steps per side per round (default: about a second's worth)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "against_revision.json")
    args = parser.parse_args(argv)
    known = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--verify", "--quiet", f"{args.revision}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if known.returncode != 0:
        parser.error(f"{args.revision!r} is no commit of this repository (try a hash from `git log`, or a tag)")
    console, _ = prepare_output(args.out)
    rows: list[dict[str, Any]] = []
    table = Table(title=f"Worker step, 1 shard, {args.wire_dtype}: this tree against {args.revision}")
    for column in ("model", f"{args.revision} median ms", "this tree median ms", "speed ratio per round", "verdict"):
        table.add_column(column, justify="left" if column == "model" else "right")
    started = time.perf_counter()
    with checked_out(args.revision) as tree:
        for model in args.models.split(","):
            row = compare(model, tree, args)
            rows.append(row)
            ratio = row["speed_ratio_per_round"]
            table.add_row(
                model,
                f"{row['revision_step_ms']['median']:.2f}",
                f"{row['this_tree_step_ms']['median']:.2f}",
                f"{ratio['median']:.2f} ({ratio['min']:.2f}–{ratio['max']:.2f})",
                row["verdict"],
            )
    console.print(table)
    results = {**run_header(None), "revision": args.revision, "wire_dtype": args.wire_dtype, "models": rows}
    results["wall_seconds"] = time.perf_counter() - started
    write_results("against_revision", argv, results, args.out, console)


if __name__ == "__main__":
    main()
