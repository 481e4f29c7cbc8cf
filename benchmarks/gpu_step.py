"""A whole ResNet-18 worker step against a hetps shard: on CUDA with pinned buffers, with pageable ones, on CPU.

    python -m benchmarks.gpu_step [--variants cuda,cuda-pageable,cuda-host-encode,cpu] [--steps 20] [--cpu-steps 5]
        [--batch 32] [--image-size 224] [--wire fp32] [--shards 1] [--torch-threads N]
        [--out benchmarks/results/gpu_step.json]

``--shards`` ``psserver serve`` processes (ASGD, one shard each) on loopback; one worker client per variant
in this process, each with a real ResNet-18 (``benchmarks.harness.resnet``, 11,689,512
parameters) on its device and psworker's ``ModelBinding``. A step is what ``psworker train``
does: forward and backward on a random batch (synchronised), gather the gradients into the
flat host buffer, push them and get the parameters back in one PushPull, scatter them into
the model. Each phase is timed on its own. Variants:

- ``cuda``: the worker's CUDA path, host buffers pinned, non-blocking copies, one synchronise; with
  8-bit pushes (``--wire int8/...``) the push is encoded on the GPU and only its 8-bit values and
  scales cross (``psworker train`` with ``encode_on = "device"``, the default);
- ``cuda-pageable``: the same with pageable host buffers (what pinning saves);
- ``cuda-host-encode``: ``cuda`` with 8-bit pushes encoded on the host after the fp32 gradients
  cross (``encode_on = "host"``; with a float push dtype the same as ``cuda``);
- ``cpu``: the same model and batch on CPU tensors (no crossing at all).

The benchmark process runs under the allocator settings of a ``psworker`` process
(``psserver.allocator.WORKER``), with torch's intra-op threads at ``--torch-threads`` (default: torch's own
count, the cores; the CPU variant computes on them, and the worker moves its chunks on one thread
whatever the count, ``psproto.inline_ops``). Variants take turns step by step, so a busy
machine slows them alike. ``--cpu-steps`` bounds the CPU variant's timed steps (a 224×224 batch
takes seconds there). Prints the phases' medians and the ratios; writes them, with the device's
name, as JSON.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.harness.processes import Fleet, HetpsJob
from benchmarks.harness.report import prepare_output, run_header, write_results
from benchmarks.harness.resnet import ResNet18
from benchmarks.harness.stats import Summary, scaled, summarize
from benchmarks.harness.steps import hetps_client, wire_problem
from psserver.allocator import WORKER, apply_allocator
from psworker.binding import ModelBinding
from psworker.client import PSClient

VARIANTS = ("cuda", "cuda-pageable", "cuda-host-encode", "cpu")
PHASES = ("compute", "gather", "round_trip", "scatter", "step")
WARMUP_STEPS = 2


@dataclass
class Worker:
    """One variant's model, host buffers and connection, and its phase times (seconds)."""

    name: str
    device: torch.device
    model: ResNet18
    binding: ModelBinding
    client: PSClient
    inputs: torch.Tensor
    targets: torch.Tensor
    samples: dict[str, list[float]] = field(default_factory=lambda: {phase: [] for phase in PHASES})

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self, record: bool) -> None:
        started = time.perf_counter()
        self.model.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(self.model(self.inputs), self.targets)
        loss.backward()  # type: ignore[no-untyped-call]
        self.synchronize()
        computed = time.perf_counter()
        grads = self.binding.gradients_to_push()
        gathered = time.perf_counter()
        self.client.push(grads, pull_into=self.binding.params)
        returned = time.perf_counter()
        self.binding.scatter_params()
        finished = time.perf_counter()
        if record:
            times = (computed - started, gathered - computed, returned - gathered, finished - returned)
            for phase, seconds in zip(PHASES, (*times, finished - started), strict=True):
                self.samples[phase].append(seconds)


def start_worker(variant: str, addresses: list[str], batch: int, image_size: int, wire: str) -> Worker:
    device = torch.device("cpu" if variant == "cpu" else "cuda")
    model = ResNet18().to(device)
    push_on_device = variant == "cuda" and wire.partition("/")[0] == "int8"
    pin = variant in ("cuda", "cuda-host-encode")
    binding = ModelBinding(model, num_shards=len(addresses), pin=pin, push_on_device=push_on_device)
    client = hetps_client(addresses, binding.layout, f"gpu-step-{variant}", wire)
    if not client.initialized:
        client.init(binding.gather_params())
    client.pull(binding.params)
    binding.scatter_params()
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(batch, 3, image_size, image_size, generator=generator).to(device)
    targets = torch.randint(0, 1000, (batch,), generator=generator).to(device)
    return Worker(variant, device, model, binding, client, inputs, targets)


def measure(workers: list[Worker], steps: int, cpu_steps: int) -> None:
    """Warm every worker up, then time them step by step in turn."""
    for worker in workers:
        for _ in range(WARMUP_STEPS):
            worker.step(record=False)
    for index in range(steps):
        for worker in workers:
            if worker.device.type != "cpu" or index < cpu_steps:
                worker.step(record=True)


def summaries(worker: Worker) -> dict[str, Summary]:
    return {phase: scaled(summarize(values), 1e3) for phase, values in worker.samples.items()}


def ratios(results: dict[str, dict[str, Summary]]) -> dict[str, float]:
    """Medians compared: CPU step over the CUDA step, the pageable crossing over the pinned one, and
    the host's encode of an 8-bit push over the GPU's."""
    found: dict[str, float] = {}

    def crossing(variant: str) -> float:
        return float(results[variant]["gather"]["median"] + results[variant]["scatter"]["median"])

    if "cuda" in results and "cpu" in results:
        found["cpu step / cuda step"] = results["cpu"]["step"]["median"] / results["cuda"]["step"]["median"]
    if "cuda" in results and "cuda-pageable" in results:
        found["pageable crossing / pinned crossing"] = crossing("cuda-pageable") / crossing("cuda")
        found["pageable step / pinned step"] = (
            results["cuda-pageable"]["step"]["median"] / results["cuda"]["step"]["median"]
        )
    if "cuda" in results and "cuda-host-encode" in results:
        found["host-encode step / gpu-encode step"] = (
            results["cuda-host-encode"]["step"]["median"] / results["cuda"]["step"]["median"]
        )
    return found


def print_results(results: dict[str, Any], console: Console) -> None:
    console.print(
        f"{results['device']}: ResNet-18, batch {results['batch']} at {results['image_size']}², "
        f"wire {results['wire']}, {results['shards']} hetps shard(s) (ASGD) on loopback, "
        f"{results['torch_threads']} torch thread(s)"
    )
    table = Table("variant", *(f"{phase} ms" for phase in PHASES), "steps")
    for variant, phases in results["variants"].items():
        table.add_row(variant, *(f"{phases[phase]['median']:.1f}" for phase in PHASES), str(int(phases["step"]["n"])))
    console.print(table)
    for name, value in results["ratios"].items():
        console.print(f"{name}: {value:.2f}×")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ", ".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each CUDA variant")
    parser.add_argument("--cpu-steps", type=int, default=5, help="timed steps of the CPU variant")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--wire", default="fp32", help="wire dtype, or PUSH/PULL such as int8/bf16")
    parser.add_argument("--shards", type=int, default=1, help="hetps shards, each a server process of its own")
    parser.add_argument("--torch-threads", type=int, default=None, help="torch's intra-op threads (default: its own)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_step.json"))
    args = parser.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown or not args.variants:
        parser.error(f"--variants: {', '.join(unknown) or 'none given'}; choose from {', '.join(VARIANTS)}")
    problem = wire_problem(args.wire)
    if problem is not None:
        parser.error(f"--wire {args.wire}: {problem}")
    threads = 1 if args.torch_threads is None else args.torch_threads
    if min(args.steps, args.cpu_steps, args.batch, args.image_size, args.shards, threads) < 1:
        parser.error("--steps, --cpu-steps, --batch, --image-size, --shards and --torch-threads must be at least 1")
    if any(v.startswith("cuda") for v in args.variants) and not torch.cuda.is_available():
        parser.error("a cuda variant was asked for but no CUDA device is available (try --variants cpu)")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    console, log_dir = prepare_output(args.out)
    started = time.perf_counter()
    results: dict[str, Any] = run_header(None)
    results |= {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu only",
        "batch": args.batch,
        "image_size": args.image_size,
        "wire": args.wire,
        "shards": args.shards,
        "torch_threads": torch.get_num_threads(),
    }
    fleet = Fleet(log_dir)
    workers: list[Worker] = []
    try:
        jobs = [
            HetpsJob(f"gpu-step-{index}", "resnet18", "asgd", (), index, args.shards) for index in range(args.shards)
        ]
        addresses = [server.address for server in fleet.start_all(jobs).values()]
        workers = [start_worker(v, addresses, args.batch, args.image_size, args.wire) for v in args.variants]
        measure(workers, args.steps, args.cpu_steps)
    finally:
        for worker in workers:
            worker.client.close()
        fleet.stop()
    results["variants"] = {worker.name: summaries(worker) for worker in workers}
    results["ratios"] = ratios(results["variants"])
    results["wall_seconds"] = time.perf_counter() - started
    print_results(results, console)
    write_results("gpu_step", argv, results, args.out, console)
    return results


if __name__ == "__main__":
    apply_allocator(WORKER)  # the allocator settings a psworker process runs under
    main()
