"""Host<->GPU crossing of a worker step: pinned flat buffers with non-blocking copies vs pageable copies.

    python -m benchmarks.cuda_transfer [--repeats 20] [--out benchmarks/results/cuda_transfer.json]

Times, for a ResNet-18-sized model on CUDA, gathering all gradients into one host vector and
scattering one host vector back into the parameters: psworker's ModelBinding (pinned
buffers, non-blocking copies, one synchronise) against the usual pageable path
(``torch.cat(...).cpu()`` and per-tensor ``copy_`` from pageable memory), in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.harness.models import ShapedModel, resnet18_shapes
from psworker.binding import ModelBinding


def _time(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/cuda_transfer.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA device")
    model = ShapedModel(resnet18_shapes()).cuda()
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    binding = ModelBinding(model)
    pageable = torch.zeros(binding.layout.total_length)
    params = list(model.parameters())

    def pageable_gather() -> None:
        pageable.copy_(torch.cat([p.grad.flatten() for p in params]).cpu())  # type: ignore[union-attr]

    def pageable_scatter() -> None:
        offset = 0
        with torch.no_grad():
            for p in params:
                p.copy_(pageable[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    cases: dict[str, Callable[[], object]] = {
        "gather grads, pinned + non-blocking (ModelBinding)": binding.gather_grads,
        "gather grads, pageable torch.cat().cpu()": pageable_gather,
        "scatter params, pinned + non-blocking (ModelBinding)": binding.scatter_params,
        "scatter params, pageable per-tensor copy": pageable_scatter,
    }
    megabytes = binding.layout.total_length * 4 / 1e6
    results = {}
    table = Table("path", "median ms", "min ms", "GB/s")
    for name, fn in cases.items():
        samples = _time(fn, args.repeats)
        median = statistics.median(samples)
        results[name] = {"median_s": median, "min_s": min(samples), "max_s": max(samples), "samples": samples}
        table.add_row(name, f"{median * 1e3:.2f}", f"{min(samples) * 1e3:.2f}", f"{megabytes / 1e3 / median:.2f}")
    Console().print(
        f"{torch.cuda.get_device_name()} — {binding.layout.total_length:,} fp32 parameters ({megabytes:.1f} MB)"
    )
    Console().print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"device": torch.cuda.get_device_name(), "parameters": binding.layout.total_length, "results": results},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
