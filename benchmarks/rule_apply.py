"""Server-side apply time of every update rule against torch.optim's fused momentum SGD.

    python -m benchmarks.rule_apply [--quick] [--out benchmarks/results/rule_apply.json]

Every rule's ``apply`` on one shard of 11,689,512 parameters (ResNet-18 size, cut into its
tensors so per-tensor rules see realistic segments), one torch thread, interleaved sample
by sample with ``torch.optim.SGD(momentum=0.9, fused=True)``; the ratio is taken per sample.
No server runs. Targets: momentum at most 1.3x fused SGD, gap-aware at most 2.5x.
Also the ``apply`` section of ``python -m benchmarks.throughput``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.harness.models import MODELS, REFERENCE_MODEL
from benchmarks.harness.report import (
    parse_settings,
    prepare_output,
    print_targets,
    run_header,
    spread,
    target,
    write_results,
)
from benchmarks.harness.settings import LR, TORCH_THREADS, Settings
from benchmarks.harness.stats import scaled, summarize
from psproto.layout import Layout
from psserver.allocator import WORKER, apply_allocator
from psserver.core.rules import RULES, PayloadKind, PushContext, RuleSpec

MOMENTUM_APPLY, GAP_AWARE_APPLY = 1.3, 2.5


def rule_options(name: str) -> dict[str, str]:
    options = {"lr": str(LR)}
    if name == "gap-aware":
        options["momentum"] = "0.9"  # GA on top of momentum SGD, like the baseline it is compared with
    return options


def _constant(tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: tensor


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure_apply(settings: Settings, console: Console) -> dict[str, Any]:
    """Every rule's ``apply`` on one shard of ``apply_length`` against fused momentum SGD, interleaved."""
    length = settings.apply_length
    generator = torch.Generator().manual_seed(1)
    gradient = torch.randn(length, generator=generator) * 1e-3
    sgd_param = torch.nn.Parameter(torch.randn(length, generator=generator) * 0.01)
    sgd_param.grad = gradient.clone()
    fused = torch.optim.SGD([sgd_param], lr=LR, momentum=0.9, fused=True)
    foreach_param = torch.nn.Parameter(sgd_param.detach().clone())
    foreach_param.grad = gradient.clone()
    foreach = torch.optim.SGD([foreach_param], lr=LR, momentum=0.9, foreach=True)
    fused.step()
    foreach.step()

    baseline: dict[str, list[float]] = {"fused": [], "foreach": []}
    rules: dict[str, Any] = {}
    # Tensors cut like the reference model, so per-tensor rules see realistic segments.
    reference = Layout.from_named_shapes(MODELS[REFERENCE_MODEL]())
    segments = reference.segments(0) if reference.total_length == length else ((0, length),)
    with console.status("apply"):
        for name in sorted(RULES):
            rule_type = RULES[name]
            kind = PayloadKind.GRADIENT if PayloadKind.GRADIENT in rule_type.accepted_kinds else PayloadKind.DELTA
            options = rule_options(name)
            entry: dict[str, Any] = {"kind": kind.name, "options": options}
            try:
                rule = RuleSpec.parse(name, options).build(length)
                params = torch.randn(length, generator=generator) * 0.01
                snapshot = params - torch.randn(length, generator=generator) * 1e-4
                update = torch.empty(length)
                ctx = PushContext(
                    worker_id=1,
                    staleness=2,
                    kind=kind,
                    segments=segments,
                    metadata={},
                    snapshot=_constant(snapshot),
                )
                apply = functools.partial(rule.apply, params, update, ctx)
                fused_times, rule_times = [], []
                for sample in range(settings.apply_samples + 1):
                    rule.on_pull(1)
                    update.copy_(gradient)  # decoding, not part of apply: the rule may overwrite it
                    fused_time = _timed(fused.step)
                    rule_time = _timed(apply)
                    baseline["foreach"].append(_timed(foreach.step))
                    if sample:  # the first sample warms caches and lazy state
                        fused_times.append(fused_time)
                        rule_times.append(rule_time)
                baseline["fused"].extend(fused_times)
                entry.update(
                    {
                        "apply_ms": scaled(summarize(rule_times), 1e3),
                        "fused_sgd_ms": scaled(summarize(fused_times), 1e3),
                        "vs_fused_sgd": summarize([r / f for r, f in zip(rule_times, fused_times, strict=True)]),
                        "state_bytes": sum(t.numel() * t.element_size() for t in rule.state_tensors().values()),
                        "finite": bool(torch.isfinite(params).all()),
                    }
                )
                del rule, params, snapshot, update, apply
            except Exception as error:  # a rule that cannot run here is reported, not fatal
                entry["error"] = repr(error)
            rules[name] = entry
    return {
        "parameters": length,
        "torch_threads": torch.get_num_threads(),
        "baseline": "torch.optim.SGD(momentum=0.9, fused=True)",
        "fused_sgd_ms": scaled(summarize(baseline["fused"]), 1e3),
        "foreach_sgd_ms": scaled(summarize(baseline["foreach"]), 1e3),
        "rules": rules,
    }


def apply_targets(apply: dict[str, Any]) -> list[dict[str, Any]]:
    targets = []
    rules = apply["rules"]
    for rule, threshold in (("momentum", MOMENTUM_APPLY), ("gap-aware", GAP_AWARE_APPLY)):
        if rule in rules and "vs_fused_sgd" in rules[rule]:
            targets.append(target(f"{rule} apply vs fused SGD (time)", rules[rule]["vs_fused_sgd"], threshold, False))
    return targets


def print_apply_table(apply: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"Rule apply, {apply['parameters']:,} parameters, {apply['torch_threads']} torch thread(s); "
        f"fused SGD {apply['fused_sgd_ms']['median']:.1f} ms, foreach SGD {apply['foreach_sgd_ms']['median']:.1f} ms"
    )
    for column in ("rule", "push", "median ms", "min–max ms", "× fused SGD", "min–max ×"):
        table.add_column(column, justify="left" if column in ("rule", "push") else "right")
    for name, entry in apply["rules"].items():
        if "error" in entry:
            table.add_row(name, entry["kind"], "error", entry["error"][:40], "", "")
            continue
        table.add_row(
            name,
            entry["kind"],
            f"{entry['apply_ms']['median']:.1f}",
            spread(entry["apply_ms"]),
            f"{entry['vs_fused_sgd']['median']:.2f}",
            spread(entry["vs_fused_sgd"], 2),
        )
    console.print(table)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    settings, out = parse_settings("rule_apply", __doc__, argv)
    console, _ = prepare_output(out)
    torch.set_num_threads(TORCH_THREADS)
    started = time.perf_counter()
    results = run_header(settings)
    results["apply"] = measure_apply(settings, console)
    results["targets"] = apply_targets(results["apply"])
    results["wall_seconds"] = time.perf_counter() - started
    print_apply_table(results["apply"], console)
    print_targets(results["targets"], console)
    write_results("rule_apply", argv, results, out, console)
    return results


if __name__ == "__main__":
    apply_allocator(WORKER)
    main()
