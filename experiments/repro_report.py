"""The reproduction's report: the runs as JSON, one PNG per experiment, and the markdown document.

A section comes from experiments run now, from an earlier run's results JSON (``--reuse``: the
runs are judged and plotted again by this version's code), or verbatim from an earlier version
of the document (``--keep``); each section says which command produced it, so one document can
be assembled from several invocations (digits and Fashion-MNIST, say) without running anything
twice.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.repro_common import Aggregates, Experiment, as_float
from experiments.repro_plots import plot

Runs = dict[int, dict[int, dict[str, Any]]]  # point index -> seed -> one run's summary

PREAMBLE = (
    "Every run is `psworker simulate`: a virtual cluster in one process where every update goes through the "
    "server's own shard and rules and every worker runs its real worker procedure, in virtual time (a 1× "
    "worker's step takes 1 virtual second). Tasks run on CPU: the digits CNN (`digits`, 8×8 images, ~40k "
    "parameters), an MLP on the same 64 pixels (`digits-mlp`), the Fashion-MNIST CNN (`fashion`, 28×28 "
    "images, ~420k parameters) and a byte-level transformer on Python's pydoc text (`tinylm`, ~0.86M "
    "parameters). Numbers are final test accuracy (on the 360 held-out digits, or on the 10,000 "
    "Fashion-MNIST test images), tinylm's final validation loss (lower is better, perplexity beside it) or "
    "virtual seconds, mean ± std over seeds (the seed drives batch sampling, and "
    "step times under random speed models; the data split and the initial model are fixed). A difference "
    "counts only when it is larger than the two spreads added. AB, GA and OrMo are reconstructed from the "
    "papers' abstracts and related code (see docs/rules.md), so their verdicts test our reconstruction as much "
    "as the papers.\n\n"
    "These are small models on small data sets, a long way from the papers' MNIST/CIFAR/ImageNet runs and "
    "budgets: a claim that does not reproduce here may still hold at the papers' scale, and one that does is "
    "only evidence."
)
VERDICT = re.compile(r"\*\*Verdict: ([^.*]+)\.\*\*")
MADE_BY = re.compile(r"^\*Made by `")
TASK_NAMES = {"digits": "digits (CNN or MLP)", "fashion": "Fashion-MNIST CNN", "tinylm": "tinylm transformer"}
COMMAND = re.compile(r"^(?:\*Made by|Made with) `([^`]+)`", re.M)


@dataclass
class Outcome:
    """One experiment's runs and the command that produced them."""

    exp: Experiment
    runs: Runs
    command: str
    elapsed_s: float
    quick: bool


def _number(value: object) -> float:
    """A stored run's metric: None is a diverged run's loss (JSON has no infinity)."""
    return math.inf if value is None else float(value)  # type: ignore[arg-type]


def aggregate(exp: Experiment, runs: Runs) -> Aggregates:
    agg: Aggregates = {}
    for index, point in enumerate(exp.points):
        by_seed = runs[index]
        values = [_number(by_seed[s][exp.metric]) for s in sorted(by_seed)]
        telemetry: dict[str, float] = {}
        for key in {k for r in by_seed.values() for k in r["telemetry"]}:
            telemetry[key] = statistics.fmean(r["telemetry"][key] for r in by_seed.values() if key in r["telemetry"])
        agg[(point.series, point.x)] = {
            "mean": statistics.fmean(values),
            # A diverged loss is infinite: the mean says so, and no spread is drawn around it.
            "std": statistics.pstdev(values) if len(values) > 1 and all(map(math.isfinite, values)) else 0.0,
            "values": values,
            "diverged": sum(bool(r["diverged"]) for r in by_seed.values()),
            "mean_staleness": statistics.fmean(float(r["mean_staleness"]) for r in by_seed.values()),
            "telemetry": telemetry,
            "wall_s": sum(float(r["wall_s"]) for r in by_seed.values()),
        }
    return agg


def _configs(exp: Experiment) -> list[Any]:
    """The points' configurations as the JSON stores them (tuples become lists)."""
    return [json.loads(json.dumps(p.config.describe(), default=str)) for p in exp.points]


def _renamed(config: dict[str, Any]) -> dict[str, Any]:
    """A stored configuration with today's field names (``target_accuracy`` became ``target``)."""
    if "target_accuracy" in config and "target" not in config:
        config = {("target" if k == "target_accuracy" else k): v for k, v in config.items()}
    return config


def load_reused(paths: Sequence[Path], catalog: Sequence[Experiment]) -> list[Outcome]:
    """The experiments stored in earlier results JSON, checked against this version's definitions.

    A stored experiment is reused only if its points (series, x, and where recorded the whole
    configuration) are this version's: otherwise its numbers would be judged under the wrong set-up.
    When several files hold one experiment, the last file's is taken (a re-run replaces a part of
    an earlier run) and the earlier ones are not checked.
    """
    by_key = {e.key: e for e in catalog}
    outcomes: list[Outcome] = []
    for path in reversed(paths):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise SystemExit(f"--reuse {path}: cannot read it as results JSON ({error})") from None
        for key, entry in data.get("experiments", {}).items():
            if any(o.exp.key == key for o in outcomes):
                continue
            exp = by_key.get(key)
            if exp is None:
                raise SystemExit(f"--reuse {path}: experiment {key!r} is not one this version defines")
            stored = sorted((p["series"], float(p["x"])) for p in entry.get("points", []))
            same = stored == sorted((p.series, p.x) for p in exp.points) and len(entry["runs"]) == len(exp.points)
            if "configs" in entry:
                same = same and [_renamed(c) for c in entry["configs"]] == _configs(exp)
            if not same:
                raise SystemExit(f"--reuse {path}: experiment {key!r} was run with other settings; run it again")
            command = entry.get("command")
            if not command:
                raise SystemExit(f"--reuse {path}: it does not record the command that made it")
            runs = {int(i): {int(s): r for s, r in by.items()} for i, by in entry["runs"].items()}
            elapsed = float(entry.get("elapsed_s", data.get("elapsed_s", 0.0)))
            outcomes.append(Outcome(exp, runs, command, elapsed, bool(data.get("quick"))))
    return outcomes[::-1]


def kept_sections(doc: Path) -> dict[str, str]:
    """An earlier document's sections by title, each with a line naming the command that made it.

    Sections from before sections named their command get the command the document's header
    named ("Generated by `...` (...)").
    """
    try:
        text = doc.read_text()
    except OSError as error:
        raise SystemExit(f"--keep {doc}: cannot read it ({error})") from None
    header = re.search(r"Generated by (`[^`]+`) \(([^)]*)\)", text)
    origin = f"*Made by {header.group(1)} ({header.group(2)}); kept from an earlier report.*" if header else None
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    sections = {}
    for part in parts:
        title, _, body = part.partition("\n")
        body = body.strip("\n")
        if origin and not MADE_BY.match(body) and not body.startswith("Made with"):
            body = origin + "\n\n" + body
        sections[title.strip()] = f"## {title.strip()}\n\n{body}\n"
    return sections


def provenance(command: str, elapsed_s: float, quick: bool) -> str:
    mode = "quick mode, a smoke-test subset too small to judge the claims" if quick else "full mode"
    return f"*Made by `{command}` ({mode}; the whole command took {elapsed_s / 60:.1f} minutes).*"


def _section(outcome: Outcome, agg: Aggregates, verdict: str, text: str, image: Path, doc: Path) -> str:
    exp = outcome.exp
    seeds = len({s for by in outcome.runs.values() for s in by})
    try:
        rel = image.relative_to(doc.parent)
    except ValueError:
        rel = image
    wall = sum(as_float(a["wall_s"]) for a in agg.values())
    return (
        f"## {exp.title}\n\n{provenance(outcome.command, outcome.elapsed_s, outcome.quick)}\n\n"
        f"**Paper.** {exp.paper}.\n\n**Claim.** {exp.claim}\n\n**Set-up.** {exp.setup} "
        f"{seeds} seed(s) per point; {len(exp.points) * seeds} runs, {wall:.0f} s of compute.\n\n"
        f"**Verdict: {verdict}.** {text}\n\n![{exp.title}]({rel.as_posix()})\n"
    )


def report(
    outcomes: Sequence[Outcome],
    order: Sequence[Experiment],
    out: Path,
    img_dir: Path,
    doc: Path,
    assembled_by: str,
    kept: dict[str, str] | None = None,
    extra_sections: Sequence[str] = (),
) -> dict[str, Any]:
    """Judge and plot ``outcomes``, write OUT/reproduction.json and the document ``doc``.

    Sections follow ``order`` (the catalog); a kept section whose title no outcome has takes its
    experiment's place, and kept sections of no experiment (the real-cluster check) come last.
    """
    img_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"command": assembled_by, "experiments": {}}
    new: dict[str, tuple[str, str]] = {}  # title -> (verdict, section)
    for outcome in outcomes:
        exp = outcome.exp
        agg = aggregate(exp, outcome.runs)
        verdict, text = exp.judge(agg)
        image = img_dir / f"repro_{exp.key}.png"
        plot(exp, agg, outcome.runs, image)
        summary["experiments"][exp.key] = {
            "title": exp.title,
            "task": exp.task,
            "claim": exp.claim,
            "verdict": verdict,
            "text": text,
            "command": outcome.command,
            "elapsed_s": outcome.elapsed_s,
            "quick": outcome.quick,
            "configs": _configs(exp),
            "points": [{"series": s, "x": x, **a} for (s, x), a in sorted(agg.items())],
            "runs": {str(i): {str(s): r for s, r in by.items()} for i, by in outcome.runs.items()},
        }
        new[exp.title] = (verdict, _section(outcome, agg, verdict, text, image, doc))
    kept = {title: body for title, body in (kept or {}).items() if title not in new}
    rows: dict[str, dict[str, str]] = {}  # claim -> task -> verdict
    sections: list[str] = []
    for exp in order:
        if exp.title in new:
            verdict, section = new[exp.title]
        elif exp.title in kept:
            section = kept.pop(exp.title)
            found = VERDICT.search(section)
            verdict = found.group(1) if found else "–"
        else:
            continue
        claim = exp.title if exp.task == "digits" else re.sub(r" \([^)]*\)$", "", exp.title)
        rows.setdefault(claim, {})[exp.task] = verdict
        sections.append(section)
    sections += list(kept.values()) + list(extra_sections)
    commands = list(dict.fromkeys(COMMAND.findall("\n".join(sections))))
    made = "\n".join(f"- `{c}`" for c in commands)
    tasks = [t for t in TASK_NAMES if any(t in by_task for by_task in rows.values())]
    table = "| claim | " + " | ".join(TASK_NAMES[t] for t in tasks) + " |\n|---|" + "---|" * len(tasks) + "\n"
    table += "\n".join(f"| {c} | " + " | ".join(by.get(t, "–") for t in tasks) + " |" for c, by in rows.items())
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(
        "# Reproductions\n\n"
        "Made by `python -m experiments.reproduce`; each section names the command that produced it, and "
        f"this document was assembled by `{assembled_by}`. The commands behind its sections:\n\n{made}\n\n"
        f"{PREAMBLE}\n\n" + table + "\n\n" + "\n".join(sections)
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "reproduction.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
