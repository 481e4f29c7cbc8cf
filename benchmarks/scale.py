"""The cost curves: how a step, Init, a checkpoint, a restore and each server's memory grow with the
model and the shards, and how the push rate and the server's CPU and memory grow with the workers.

    python -m benchmarks.scale [--quick] [--out benchmarks/results/scale.json]

**Parameters** (one worker in this process, ASGD, fp32): models of 1M to 350M parameters (tensors
of 1,024 columns) over 1, 2, 4 and 8 shards. Per point, on fresh servers: the shards' start, Init,
the step (push a gradient, get the parameters back) taking turns step by step with the bare gRPC
mover (``benchmarks.harness.bare_grpc``) moving the same bytes through as many servers, a
checkpoint of every shard at once (the Checkpoint RPC), and the restore: the same servers started
again on that checkpoint folder, until ready (beside their first start, without one). Each
server's peak RSS against 2 × what it must hold + 350 MB. A point whose processes would not fit in
the memory available then is skipped, and the results say so.
Target: hetps's step time grows with the bytes a step moves no faster than 1.2× the bare mover's
(least-squares slopes over the sizes, per shard count); every server within its memory limit.

**Workers** (a ~100k-parameter model on one shard, default server settings, a fresh server per
consistency): 1 to 512 workers, each its own connection, name and heartbeats
(``benchmarks.harness.crowd``: threads in a few load processes), under async, SSP (bound 3) and
BSP. Per level: acknowledged pushes/s, the clock's rounds/s, the server's CPU per push, its peak
RSS, errors, evictions and workers stuck in a call past the end. A level with a problem ends that
consistency (the levels above are listed as not run), so a server that stalls is data, not a hang.
Target per consistency at the most workers: no error, eviction or stuck worker, every worker
pushed, every acknowledged push applied once (async and SSP, from the server's Status).

Plots go to ``benchmarks/results/scale/`` (the folder beside ``--out``, named after it).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import torch
from rich.console import Console

from benchmarks.harness.crowd import Crowd
from benchmarks.harness.curves import plot_curves
from benchmarks.harness.memory import rss_limit_mb
from benchmarks.harness.models import MODELS, Shapes
from benchmarks.harness.processes import Fleet, HetpsJob, ServerProcess, cpu_of, cpu_seconds, vm_mb
from benchmarks.harness.refusals import evictions
from benchmarks.harness.report import prepare_output, print_targets, run_header, target, write_results
from benchmarks.harness.scale_tables import print_tables
from benchmarks.harness.settings import TORCH_THREADS
from benchmarks.harness.stats import scaled, summarize
from benchmarks.harness.step_systems import SystemSpec, start_movers
from benchmarks.harness.steps import BareStep, initialize_parameters, seeded_parameters
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.allocator import WORKER, apply_allocator
from psserver.core.config import ShardConfig
from psworker.client import PSClient

# The sized models' tensors: at most 4M parameters each, and enough of them for 8 balanced shards.
COLUMNS, MAX_ROWS, MIN_TENSORS = 1024, 4096, 16
SLOPE_LIMIT = 1.2
# What the processes of a parameters point hold, in copies of the model's fp32 bytes: the worker's
# parameters and update (2), the bare client's Init copy (1), the hetps shards (4.3x their bytes
# measured at 124M, so 4.5) and the bare movers (2.5); and each server process's own ~300 MB.
MODEL_COPIES, PROCESS_GB = 10.0, 0.3
MEMORY_SHARE = 0.7  # of MemAvailable a point may plan to use
DEFAULT_LEASE_S = {f.name: f.default for f in dataclasses.fields(ShardConfig)}["lease_seconds"]


@dataclasses.dataclass(frozen=True)
class ScaleSettings:
    sizes: tuple[int, ...] = (1_000_000, 10_000_000, 50_000_000, 124_000_000, 350_000_000)
    shards: tuple[int, ...] = (1, 2, 4, 8)
    warmup: int = 2
    steps: int = 5
    workers: tuple[int, ...] = (1, 8, 64, 256, 512)
    consistencies: tuple[str, ...] = ("async", "ssp", "bsp")
    seconds: float = 6.0
    load_processes: int = 4

    @classmethod
    def quick(cls) -> ScaleSettings:
        return cls(sizes=(1_000_000, 10_000_000, 50_000_000), shards=(1, 2), steps=3, workers=(1, 8, 64), seconds=3.0)


def sized_shapes(parameters: int) -> Shapes:
    """About ``parameters`` parameters as at least ``MIN_TENSORS`` tensors of ``COLUMNS`` columns and
    at most ``MAX_ROWS`` rows (shards split at tensor boundaries, so every shard count gets its share)."""
    rows = max(MIN_TENSORS, round(parameters / COLUMNS))
    count = max(MIN_TENSORS, math.ceil(rows / MAX_ROWS))
    shapes: Shapes = []
    for index in range(count):
        take = rows // count + (index < rows % count)
        shapes.append((f"block{index}.weight", (take, COLUMNS)))
    return shapes


def memory_needed_gb(parameters: int, shards: int) -> float:
    """What a parameters point's processes are planned to hold at their peak."""
    return MODEL_COPIES * 4 * parameters / 1e9 + PROCESS_GB * 2 * shards


def available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / 1e9
    return math.inf


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of ``ys`` against ``xs``; a ValueError without two distinct xs."""
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread_x = sum((x - mean_x) ** 2 for x in xs)
    if len(xs) != len(ys) or spread_x == 0:
        raise ValueError(f"a line needs two distinct x values and as many y, not {list(xs)} and {list(ys)}")
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread_x
    return slope, mean_y - slope * mean_x


def slope_targets(points: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Per shard count with two sizes or more: the slopes (seconds per GB a step moves) of hetps and
    the bare mover, and the target that hetps's is at most ``SLOPE_LIMIT`` times the mover's."""
    fits, targets = {}, []
    measured = [p for p in points if "step_ms" in p]
    for shards in sorted({p["shards"] for p in measured}):
        row = [p for p in measured if p["shards"] == shards]
        if len({p["bytes_per_step"] for p in row}) < 2:
            continue
        gigabytes = [p["bytes_per_step"] / 1e9 for p in row]
        slopes = {
            system: fit_line(gigabytes, [p["step_ms"][system]["median"] / 1e3 for p in row])
            for system in ("hetps", "bare")
        }
        ratio = slopes["hetps"][0] / slopes["bare"][0]
        fits[str(shards)] = {
            "seconds_per_gb": {s: fit[0] for s, fit in slopes.items()},
            "intercept_s": {s: fit[1] for s, fit in slopes.items()},
            "ratio": ratio,
            "sizes": len(row),
        }
        detail = f"hetps {slopes['hetps'][0]:.3f} s/GB, bare {slopes['bare'][0]:.3f} s/GB, {len(row)} sizes"
        name = f"step time slope vs bare gRPC, {shards} shard{'s' * (shards > 1)}"
        targets.append(target(name, summarize([ratio]), SLOPE_LIMIT, False, detail))
    return fits, targets


def memory_target(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every hetps server's peak RSS (first run and restored) over its limit: at most 1."""
    ratios = [
        (peak / server["limit_mb"], f"{p['parameters'] / 1e6:.0f}M x {p['shards']}, shard {server['shard']}")
        for p in points
        if "servers" in p
        for server in p["servers"]
        for peak in (server["peak_rss_mb"], server["restored_peak_rss_mb"])
    ]
    if not ratios:
        return []
    worst, where = max(ratios)
    detail = f"worst: {where}; limit 2 x must-hold + 350 MB, one worker"
    return [target("every server's peak RSS over its limit", summarize([worst]), 1.0, False, detail)]


def _stub(address: str) -> tuple[grpc.Channel, ps_pb2_grpc.ParameterServerStub]:
    channel = grpc.insecure_channel(address)
    return channel, ps_pb2_grpc.ParameterServerStub(channel)


def _timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _steps(systems: dict[str, Callable[[], Any]], settings: ScaleSettings) -> dict[str, Any]:
    """Warm every system up, then time their steps taking turns in a fresh order every round."""
    for _ in range(settings.warmup):
        for step in systems.values():
            step()
    samples: dict[str, list[float]] = {name: [] for name in systems}
    order = list(systems)
    for _ in range(settings.steps):
        random.shuffle(order)
        for name in order:
            samples[name].append(_timed(systems[name]))
    return {
        "step_ms": {name: scaled(summarize(s), 1e3) for name, s in samples.items()},
        "hetps_vs_bare_time": summarize([h / b for h, b in zip(samples["hetps"], samples["bare"], strict=True)]),
    }


def _checkpoint_clocks(addresses: Sequence[str]) -> list[int]:
    """Each shard's clock (restored from a checkpoint: the clock it was written at)."""
    clocks = []
    for address in addresses:
        channel, stub = _stub(address)
        with channel:
            clocks.append(stub.Status(ps_pb2.StatusRequest(), timeout=30).clock)
    return clocks


def _checkpoint(addresses: Sequence[str]) -> tuple[float, list[int]]:
    """Seconds for every shard to write a checkpoint at once (the Checkpoint RPC), and their clocks."""
    channels = [_stub(address) for address in addresses]
    try:
        with ThreadPoolExecutor(max_workers=len(channels)) as pool:
            started = time.perf_counter()
            list(
                pool.map(
                    lambda stub: stub.Checkpoint(ps_pb2.CheckpointRequest(), timeout=600), (s for _, s in channels)
                )
            )
            seconds = time.perf_counter() - started
    finally:
        for channel, _ in channels:
            channel.close()
    return seconds, _checkpoint_clocks(addresses)


def _checkpoints(folder: Path) -> tuple[str, ...]:
    """A shard's flags: checkpoints into ``folder`` (restored from there on start), none by itself."""
    return ("--checkpoint-dir", str(folder), "--checkpoint-every", "1000000000")


def measure_point(parameters: int, shards: int, settings: ScaleSettings, log_dir: Path) -> dict[str, Any]:
    """One (parameters, shards) point on fresh servers: start, Init, steps beside the bare mover,
    checkpoint, restore, peak RSS."""
    shapes = sized_shapes(parameters)
    layout = Layout.from_named_shapes(shapes, shards)
    length = layout.total_length
    folder = Path(tempfile.mkdtemp(prefix="checkpoints-", dir=log_dir))
    jobs = [
        HetpsJob(f"scale-{length}-{shards}-{i}", str(length), "asgd", (), i, shards, _checkpoints(folder / str(i)))
        for i in range(shards)
    ]
    result: dict[str, Any] = {"parameters": length, "shards": shards, "bytes_per_step": 8 * length}
    hetps, movers, restored = Fleet(log_dir), Fleet(log_dir), Fleet(log_dir)
    try:
        started = time.perf_counter()
        by_label = hetps.start_all(jobs)
        first = [by_label[job.label] for job in jobs]
        result["start_s"] = time.perf_counter() - started
        addresses = [server.address for server in first]
        bare_servers = start_movers(movers, [SystemSpec(f"bare-{shards}shard-fp32", "bare", shards, "fp32")])
        params = seeded_parameters(length)
        update = torch.randn(length, generator=torch.Generator().manual_seed(1)) * 1e-4
        client = PSClient(addresses, layout, name="scale-worker")
        try:
            result["init_s"] = _timed(lambda: client.init(params))
            bare = BareStep([m.address for m in bare_servers[("bare", shards)]], layout, "scale", "fp32", params)
            result |= _steps(
                {"hetps": lambda: client.push(update, pull_into=params), "bare": lambda: bare.step(update, params)},
                settings,
            )
            bare.close()
            result["bare_peak_rss_mb"] = [vm_mb(m.pid, "VmHWM") for m in movers.servers]
            movers.stop()
            # Which phase sets a server's peak: the steps (Init included), or the checkpoint after them.
            steps_peaks = [vm_mb(server.pid, "VmHWM") for server in first]
            result["checkpoint_s"], clocks = _checkpoint(addresses)
        finally:
            client.close()
        peaks = [vm_mb(server.pid, "VmHWM") for server in first]
        result["checkpoint_mb"] = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6
        hetps.stop()  # SIGTERM: each writes its final checkpoint
        started = time.perf_counter()
        by_label = restored.start_all(jobs)
        second = [by_label[job.label] for job in jobs]
        result["restore_s"] = time.perf_counter() - started
        restored_peaks = [vm_mb(server.pid, "VmHWM") for server in second]
        result["restored_clocks_match"] = _checkpoint_clocks([server.address for server in second]) == clocks
        result["servers"] = [
            {
                "shard": index,
                "must_hold_mb": shard.length * 4 / 1e6,
                "limit_mb": rss_limit_mb(shard.length * 4 / 1e6),
                "steps_peak_rss_mb": steps_peaks[index],
                "peak_rss_mb": peaks[index],
                "restored_peak_rss_mb": restored_peaks[index],
            }
            for index, shard in enumerate(layout.shards)
        ]
    finally:
        for fleet in (movers, hetps):
            fleet.stop()
        for server in restored.servers:  # nothing to keep: no final checkpoint
            server.process.kill()
            server.process.wait()
        shutil.rmtree(folder, ignore_errors=True)
    return result


def measure_parameters(settings: ScaleSettings, log_dir: Path, console: Console) -> list[dict[str, Any]]:
    points = []
    with console.status("parameters") as status:
        for parameters in settings.sizes:
            for shards in settings.shards:
                needed, available = memory_needed_gb(parameters, shards), available_gb()
                if needed > MEMORY_SHARE * available:
                    why = f"needs ~{needed:.1f} GB, {available:.1f} GB available"
                    points.append({"parameters": parameters, "shards": shards, "skipped": why})
                    continue
                status.update(f"parameters: {parameters / 1e6:.0f}M over {shards} shard(s)")
                try:
                    points.append(measure_point(parameters, shards, settings, log_dir))
                except Exception as error:  # recorded: the other points still run
                    points.append({"parameters": parameters, "shards": shards, "error": repr(error)})
    return points


def _status(stub: ps_pb2_grpc.ParameterServerStub) -> ps_pb2.StatusResponse | None:
    """The server's Status, or None when it does not answer in 5 s (a stalled server)."""
    try:
        reply: ps_pb2.StatusResponse = stub.Status(ps_pb2.StatusRequest(), timeout=5)
    except grpc.RpcError:
        return None
    return reply


def _until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


def measure_level(
    crowd: Crowd,
    server: ServerProcess,
    stub: ps_pb2_grpc.ParameterServerStub,
    workers: int,
    consistency: str,
    seconds: float,
) -> dict[str, Any]:
    """``workers`` workers pushing for ``seconds``: what they and the server did, and the problems."""
    before, evicted = _status(stub), evictions(server.ready.metrics_port)
    start_at = crowd.begin([server.address], MODELS["small"](), workers, seconds)
    _until(start_at)
    cpu, load, opened = cpu_seconds(server.pid), cpu_of(crowd.pids), _status(stub)
    _until(start_at + seconds)
    cpu, load, closed = cpu_seconds(server.pid) - cpu, cpu_of(crowd.pids) - load, _status(stub)
    report = crowd.end()
    after = _status(stub)
    level: dict[str, Any] = {**report, "evictions": evictions(server.ready.metrics_port) - evicted}
    level["pushes_per_s"] = report["pushes_in_window"] / seconds
    # None: the server's Status did not answer in time at one end of the window.
    level["rounds_per_s"] = (closed.clock - opened.clock) / seconds if opened and closed else None
    pushes = report["pushes_in_window"]
    level["server_cpu_ms_per_push"] = 1e3 * cpu / pushes if pushes else None  # none: nothing to share it
    level["server_cores_busy"], level["load_cores_busy"] = cpu / seconds, load / seconds
    level["server_peak_rss_mb"], level["server_rss_mb"] = vm_mb(server.pid, "VmHWM"), vm_mb(server.pid, "VmRSS")
    level["applied"] = after.applied_pushes - before.applied_pushes if before and after else -1
    # Under BSP a round applies every worker's push as one update: the server counts rounds.
    level["applied_once"] = consistency == "bsp" or level["applied"] == report["acknowledged"]
    problems = {
        "errors": report["errors"] + report["join_failures"],
        "evictions": level["evictions"],
        "stuck": report["stuck"],
        "never pushed": workers - report["workers_that_pushed"],
        "not applied once": int(not level["applied_once"]),
    }
    level["problems"] = {name: count for name, count in problems.items() if count}
    return level


def _levels(
    crowd: Crowd, server: ServerProcess, consistency: str, settings: ScaleSettings, console: Console
) -> dict[str, Any]:
    """Every level of workers on ``server`` until one has a problem (the rest: not run)."""
    initialize_parameters("small", [server.address])
    channel, stub = _stub(server.address)
    levels: dict[str, Any] = {}
    stalled = 0
    with channel:
        for workers in settings.workers:
            if stalled:
                levels[str(workers)] = {"not_run": f"after the problems at {stalled} workers"}
                continue
            with console.status(f"workers: {workers} under {consistency}"):
                level = measure_level(crowd, server, stub, workers, consistency, settings.seconds)
            levels[str(workers)] = level
            stalled = workers if level["problems"] else 0
    return levels


def measure_workers(settings: ScaleSettings, log_dir: Path, console: Console) -> dict[str, Any]:
    """A fresh server per consistency (all started before the load processes, whose start would
    slow theirs), each driven through the levels of workers."""
    results: dict[str, Any] = {}
    fleet = Fleet(log_dir)
    try:
        config = {"shard": {"lease_seconds": DEFAULT_LEASE_S}}
        jobs = {
            c: HetpsJob(f"workers-{c}", "small", "asgd", (), 0, 1, ("--consistency", c), config)
            for c in settings.consistencies
        }
        with console.status("starting the workers' servers"):
            servers = fleet.start_all(list(jobs.values()))
        crowd = Crowd(settings.load_processes)
        for consistency, job in jobs.items():
            results[consistency] = {"lease_seconds": DEFAULT_LEASE_S}
            try:
                results[consistency]["levels"] = _levels(crowd, servers[job.label], consistency, settings, console)
            except Exception as error:  # recorded; the load processes start afresh for the next
                results[consistency]["error"] = repr(error)
                crowd.close()
                crowd = Crowd(settings.load_processes)
        crowd.close()
    finally:
        fleet.stop()
    return results


def worker_targets(workers: dict[str, Any]) -> list[dict[str, Any]]:
    """Per consistency, the most workers' level: no problem at all (a level not run, or a run that
    failed, counts as one)."""
    targets = []
    for consistency, data in workers.items():
        levels = data.get("levels", {})
        most = max(levels, key=int, default="its")
        problems = levels[most].get("problems", {"not run": 1}) if levels else {"failed": 1}
        detail = ", ".join(f"{count} {name}" for name, count in problems.items()) or "none"
        entry = target(f"{most} workers under {consistency}: problems", summarize([sum(problems.values())]), 0, False)
        targets.append(entry | {"detail": detail})
    return targets


def _counts(text: str) -> tuple[int, ...]:
    """``1M,124M`` or ``1,8`` as counts, each at least 1; an ArgumentTypeError says what is wrong."""
    try:
        counts = tuple(
            round(float(part.removesuffix("M")) * (1e6 if part.endswith("M") else 1)) for part in text.split(",")
        )
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list like 1M,124M or 1,8") from None
    if min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every count must be at least 1")
    return counts


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="three sizes over 1 and 2 shards, up to 64 workers")
    parser.add_argument("--sizes", type=_counts, help="parameter counts, e.g. 1M,124M (default: 1M to 350M)")
    parser.add_argument("--shards", type=_counts, help="shard counts, e.g. 1,8 (default: 1,2,4,8)")
    parser.add_argument("--workers", type=_counts, help="worker counts, e.g. 1,512 (default: 1,8,64,256,512)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/scale.json"))
    args = parser.parse_args(argv)
    settings = ScaleSettings.quick() if args.quick else ScaleSettings()
    chosen = {name: getattr(args, name) for name in ("sizes", "shards", "workers") if getattr(args, name)}
    settings = dataclasses.replace(settings, **chosen)
    console, log_dir = prepare_output(args.out)
    torch.set_num_threads(TORCH_THREADS)
    started = time.perf_counter()
    results = run_header(None) | {"settings": dataclasses.asdict(settings)}
    results["parameters"] = measure_parameters(settings, log_dir, console)
    results["workers"] = measure_workers(settings, log_dir, console)
    results["slopes"], slope_checks = slope_targets(results["parameters"])
    results["targets"] = [*slope_checks, *memory_target(results["parameters"]), *worker_targets(results["workers"])]
    results["plots"] = [str(path) for path in plot_curves(results, args.out.parent / args.out.stem)]
    results["wall_seconds"] = time.perf_counter() - started
    print_tables(results, console)
    print_targets(results["targets"], console)
    write_results("scale", argv, results, args.out, console)
    return results


if __name__ == "__main__":
    apply_allocator(WORKER)
    main()
