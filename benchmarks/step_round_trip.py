"""A worker step (push a gradient, get the parameters back) through hetps, its transport's ceiling and a peer.

    python -m benchmarks.step_round_trip [--quick] [--repeats N] [--out benchmarks/results/step_round_trip.json]

For a ResNet-18-sized model (11,689,512 fp32 parameters) and a ~100k-parameter model, one
worker in this process steps through: hetps (1 and 2 shards, fp32 and bf16 on the wire, and 1
shard with 8-bit pushes and bf16 pulls); the same 1-shard rows with every PushPull sent as two
streams (``streams``); a bare gRPC byte mover with the same chunking and bytes
(``benchmarks.harness.bare_grpc``, the transport's ceiling), and the same mover doing the
arithmetic of an SGD step too (``arith`` rows: 8-bit encode with error feedback, decode, apply,
reply conversion, and hetps's header and acknowledgement messages; ``overlap`` rows: its apply made
span by span as the reply is sent); and a ``torch.distributed.rpc``
parameter server (``benchmarks.harness.torch_rpc_peer``, TensorPipe over TCP, fp32), plus, as
a reference row only, the same peer on TensorPipe's default channels (its worker in a process
of its own, ``benchmarks.harness.peer_remote``).
Every server runs in its own process on loopback, under hetps's allocator settings and torch
thread count, and every system gets the same warm-up steps. Systems are interleaved step by
step, in a fresh (seeded) order every round so no system always follows the same one, and ratios
compare like with like on a busy machine; around every step the CPU time of
the system's servers and of its client is read.
Targets: hetps 1 shard fp32 at least 0.8x the peer's speed, bf16 at least 1.3x, 8-bit pushes
with bf16 pulls at least 1.5x the peer's fp32 step (beside it, what the bare mover moving the
same bytes reaches: the most this transport allows) and at most 0.4x fp32's bytes per step;
hetps at least 0.9x the bare mover's speed with the same shards and wire dtype. Before they are judged,
the baselines are checked (``benchmarks.harness.validity``: allocator settings, each against
its own repeats, the peer against the bare mover); a target judged against a baseline that is
out of line is INVALID, never PASS. A last table splits each row's distance from the bare mover
into the arithmetic (arith vs bare) and hetps's own work (hetps vs arith).
Also the ``steps`` section of ``python -m benchmarks.throughput``.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from rich.console import Console

from benchmarks.harness.models import MODELS
from benchmarks.harness.peer_remote import RemotePeerStep, RemoteWorker
from benchmarks.harness.processes import Fleet, cpu_of, vm_mb
from benchmarks.harness.report import (
    parse_settings,
    prepare_output,
    print_targets,
    print_validity,
    run_header,
    target,
    write_results,
)
from benchmarks.harness.settings import TORCH_THREADS, Settings
from benchmarks.harness.stats import Summary, scaled, speed_ratio, summarize
from benchmarks.harness.step_systems import (
    HETPS_KINDS,
    HETPS_VARIANTS,
    INT8,
    MOVER_KINDS,
    PEER,
    PEER_DEFAULT,
    PLAIN,
    Comparisons,
    HetpsAddresses,
    SystemSpec,
    hetps_addresses,
    hetps_jobs,
    server_addresses,
    start_comparisons,
    step_systems,
)
from benchmarks.harness.step_tables import print_step_limits, print_step_tables
from benchmarks.harness.steps import BareStep, HetpsStep, PeerStep, StepSystem, time_steps, warm_up
from benchmarks.harness.validity import (
    ceiling_check,
    invalidate,
    repeat_spread_check,
    summarize_checks,
)
from psproto import codec
from psproto.layout import Layout
from psserver.allocator import WORKER, apply_allocator

PEER_FP32, PEER_BF16 = 0.8, 1.3
# 8-bit pushes with bf16 pulls against the peer's fp32 step; their bytes per step against fp32's.
PEER_INT8, INT8_BYTES = 1.5, 0.4
BARE_FRACTION = 0.9
# The systems' order in each round of steps is drawn from this seed, so a run can be repeated.
ORDER_SEED = 0


# -- the measurement --------------------------------------------------------------------------


def measure_steps(
    settings: Settings,
    hetps: HetpsAddresses,
    movers: dict[tuple[str, int], list[str]],
    server_pids: dict[str, int],
    console: Console,
    remote: RemoteWorker | None = None,
    systems: Sequence[SystemSpec] | None = None,
) -> dict[str, Any]:
    """Worker steps through every system (``systems``, default :func:`step_systems`), interleaved step by step.

    A repeat of a model is ``steps[model]`` rounds; a round is one step of every system, in
    a fresh order every round. All systems therefore sample the same moments of a shared,
    noisy machine, and a repeat's ratio compares medians taken over the same few seconds.

    Around every step (outside its timing) the CPU time of the system's server processes
    (``server_pids``: address, or ``"peer"``, to pid) and of this process (the client) is read:
    on a machine with fewer cores than busy threads the step's time follows the CPU both
    sides spend on it. ``remote`` is the reference peer's worker (its system is left out without one).
    """
    specs = [spec for spec in systems or step_systems() if remote is not None or spec.kind != "peer-default"]
    generator = torch.Generator().manual_seed(0)
    runs: list[tuple[str, SystemSpec, StepSystem, torch.Tensor, torch.Tensor]] = []
    per_repeat: dict[tuple[str, str], list[float]] = {}
    samples: dict[tuple[str, str], list[float]] = {}
    # (server seconds, client seconds) of CPU over every timed step, per (model, system)
    cpu: dict[tuple[str, str], list[float]] = {}
    pids_of: dict[tuple[str, str], list[int]] = {}
    warmed: dict[tuple[str, str], int] = {}
    try:
        for model in settings.models:
            shapes = MODELS[model]()
            length = Layout.from_named_shapes(shapes).total_length
            flat = torch.randn(length, generator=generator) * 0.01
            update = torch.randn(length, generator=generator) * 1e-4
            out = torch.empty(length)
            for spec in specs:
                layout = Layout.from_named_shapes(shapes, spec.shards)
                addresses = server_addresses(spec, model, hetps, movers)
                system = _step_system(spec, model, addresses, layout, flat, remote)
                pids_of[(model, spec.name)] = [server_pids[address] for address in addresses]
                runs.append((model, spec, system, update, out))
                per_repeat[(model, spec.name)] = []
                samples[(model, spec.name)] = []
                cpu[(model, spec.name)] = [0.0, 0.0]
        for model, spec, system, update, out in runs:
            processes = [*pids_of[(model, spec.name)], *system.client_pids]
            warmed[(model, spec.name)] = warm_up(system, update, out, settings.warmup, partial(_rss_mb, processes))
        order = random.Random(ORDER_SEED)
        with console.status("steps") as status:
            # Repeat -1 is interleaved like the others but not recorded: the peer, even once warm by
            # the memory rule, took up to 2.5x as long in the first interleaved repeat as in later ones.
            for repeat in range(-1, settings.repeats):
                for model in settings.models:
                    done = "settling (not timed)" if repeat < 0 else f"repeat {repeat + 1}/{settings.repeats}"
                    status.update(f"steps: {model}, {done}")
                    mine = [run for run in runs if run[0] == model]
                    cpu_used = cpu if repeat >= 0 else {key: [0.0, 0.0] for key in cpu}
                    times = _rounds(mine, settings.steps[model], order, pids_of, cpu_used)
                    for name, taken in times.items() if repeat >= 0 else ():
                        per_repeat[(model, name)].append(statistics.median(taken))
                        samples[(model, name)].extend(taken)
    finally:
        for _, _, system, _, _ in runs:
            system.close()
    return step_results(settings, specs, per_repeat, samples, cpu, warmed)


def _rounds(
    runs: list[tuple[str, SystemSpec, StepSystem, torch.Tensor, torch.Tensor]],
    count: int,
    order: random.Random,
    pids_of: dict[tuple[str, str], list[int]],
    cpu: dict[tuple[str, str], list[float]],
) -> dict[str, list[float]]:
    """``count`` rounds of one step of every run (of one model), in ``order``; each system's step
    times, its CPU seconds added to ``cpu``."""
    times: dict[str, list[float]] = {spec.name: [] for _, spec, _, _, _ in runs}
    for _ in range(count):
        # A fresh order every round. Rotating one order kept each system's neighbours:
        # a system always came right after the same one (hetps-1shard-fp32 after the
        # peer on default channels, whose threads spin on after its step).
        for model, spec, system, update, out in order.sample(runs, len(runs)):
            key = (model, spec.name)
            times[spec.name] += _one_step(system, update, out, pids_of[key], cpu[key])
            if not bool(torch.isfinite(out).all()):
                raise RuntimeError(f"{spec.name} returned non-finite parameters for {model}")
    return times


def _step_system(
    spec: SystemSpec,
    model: str,
    addresses: list[str],
    layout: Layout,
    flat: torch.Tensor,
    remote: RemoteWorker | None,
) -> StepSystem:
    """The worker side of ``spec``'s system for ``model``, its servers at ``addresses``."""
    if spec.kind in HETPS_KINDS:
        variant = HETPS_VARIANTS.get(spec.kind, PLAIN)
        return HetpsStep(addresses, layout, f"bench-{spec.name}", spec.wire_dtype, flat, unary=variant.unary)
    if spec.kind in MOVER_KINDS:
        key, arithmetic, by_span = f"{model}-{spec.name}", spec.kind != "bare", spec.kind == "overlap"
        return BareStep(addresses, layout, key, spec.wire_dtype, flat, arithmetic=arithmetic, apply_by_span=by_span)
    if spec.kind == "peer":
        return PeerStep(model, flat)
    assert remote is not None
    return RemotePeerStep(remote, model, layout.total_length)


def _one_step(
    system: StepSystem, update: torch.Tensor, out: torch.Tensor, pids: list[int], used: list[float]
) -> list[float]:
    """One timed step of ``system``; adds the CPU seconds its servers (``pids``) and its client spent
    on it to ``used`` (server, client), read outside the timing."""
    clients = system.client_pids
    server_before = cpu_of(pids)
    client_before = time.process_time() + cpu_of(clients)
    taken = time_steps(system, update, out, 1)
    used[0] += cpu_of(pids) - server_before
    used[1] += time.process_time() + cpu_of(clients) - client_before
    return taken


def _rss_mb(pids: list[int]) -> float:
    return sum(vm_mb(pid, "VmRSS") for pid in pids)


def step_results(
    settings: Settings,
    specs: list[SystemSpec],
    per_repeat: dict[tuple[str, str], list[float]],
    samples: dict[tuple[str, str], list[float]],
    cpu: dict[tuple[str, str], list[float]],
    warmed: dict[tuple[str, str], int],
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for model in settings.models:
        length = Layout.from_named_shapes(MODELS[model]()).total_length
        systems: dict[str, Any] = {}
        for spec in specs:
            repeats = per_repeat[(model, spec.name)]
            # A "PUSH/PULL" system's two directions differ: their mean.
            dtypes = [codec.PUSH_DTYPE_NAMES[name] for name in spec.wire_dtype.split("/")]
            wire_bytes = sum(codec.wire_bytes(length, dtype) for dtype in dtypes) // len(dtypes)
            median_s = statistics.median(repeats)
            taken = samples[(model, spec.name)]
            server_cpu, client_cpu = (seconds / len(taken) for seconds in cpu[(model, spec.name)])
            systems[spec.name] = {
                "kind": spec.kind,
                "shards": spec.shards,
                "wire_dtype": spec.wire_dtype,
                "wire_bytes_each_way": wire_bytes,
                "step_ms": scaled(summarize(repeats), 1e3),
                "step_ms_all_samples": scaled(summarize(samples[(model, spec.name)]), 1e3),
                "steps_per_s": 1.0 / median_s,
                "gb_per_s_each_way": wire_bytes / median_s / 1e9,
                "repeat_medians_ms": [t * 1e3 for t in repeats],
                "warmup_steps": warmed[(model, spec.name)],
                # Means over every timed step: server processes (all shards) and the client process.
                "cpu_ms_per_step": {
                    "server": server_cpu * 1e3,
                    "client": client_cpu * 1e3,
                    "busy_cores": (server_cpu + client_cpu) / statistics.fmean(taken),
                },
            }
        pairs = [(spec.name, PEER) for spec in specs if spec.kind == "hetps"]
        pairs += [(s.name, s.name.replace("hetps", "bare")) for s in specs if s.kind == "hetps"]
        # The ceiling against the peer: the most any server on this gRPC stack could reach.
        pairs += [(s.name, PEER) for s in specs if s.kind == "arith" or (s.kind == "bare" and s.shards == 1)]
        for spec in specs:
            if spec.kind == "arith":
                pairs += [
                    (spec.name.replace("arith", "hetps"), spec.name),
                    (spec.name, spec.name.replace("arith", "bare")),
                ]
        pairs += [(s.name, s.name.replace("overlap", "arith")) for s in specs if s.kind == "overlap"]
        pairs += [
            (s.name, s.name.replace(s.kind, other, 1))
            for s in specs
            if s.kind in HETPS_VARIANTS
            for other in HETPS_VARIANTS[s.kind].compared_with
        ]
        if any(spec.name == PEER_DEFAULT for spec in specs):
            # For reference only: the peer when TensorPipe may skip the socket.
            pairs += [(f"hetps-1shard-{dtype}", PEER_DEFAULT) for dtype in ("fp32", "bf16")] + [(PEER, PEER_DEFAULT)]
        measured = {spec.name for spec in specs}
        ratios = {
            f"{first} vs {other}": speed_ratio(
                per_repeat[(model, first)], per_repeat[(model, other)], samples[(model, first)], samples[(model, other)]
            )
            for first, other in pairs
            if first in measured and other in measured
        }
        results[model] = {"parameters": length, "systems": systems, "speed_ratios": ratios}
    return results


def step_validity(settings: Settings, steps: dict[str, Any]) -> dict[str, Any]:
    """The checks of ``benchmarks.harness.validity`` on the baselines the targets are judged against.

    Systems are named ``MODEL:SYSTEM``. Each bare mover and the peer against its own repeats; the
    peer against the bare mover (1 shard, fp32)."""
    checks = []
    for model in settings.models:
        systems = steps[model]["systems"]
        for name, system in systems.items():
            if system["kind"] in ("bare", "arith", "overlap", "peer"):
                checks.append(repeat_spread_check(f"{model}:{name}", system["repeat_medians_ms"]))
        checks.append(
            ceiling_check(
                f"{model}:{PEER}",
                f"{model}:bare-1shard-fp32",
                systems[PEER]["repeat_medians_ms"],
                systems["bare-1shard-fp32"]["repeat_medians_ms"],
            )
        )
    return summarize_checks(checks)


def step_targets(settings: Settings, steps: dict[str, Any], validity: dict[str, Any]) -> list[dict[str, Any]]:
    """The reference model's speed against the peer, and every model's against the bare mover;
    INVALID where the baseline a target is judged against is out of line (``validity``)."""
    model = settings.reference
    ratios = steps[model]["speed_ratios"]
    peer = [f"{model}:{PEER}"]
    targets = [
        invalidate(
            target(
                f"{model} step, 1 shard, fp32 vs torch.rpc peer",
                ratios[f"hetps-1shard-fp32 vs {PEER}"],
                PEER_FP32,
                True,
            ),
            peer,
            validity,
        ),
        invalidate(
            target(
                f"{model} step, 1 shard, bf16 vs torch.rpc peer",
                ratios[f"hetps-1shard-bf16 vs {PEER}"],
                PEER_BF16,
                True,
            ),
            peer,
            validity,
        ),
        invalidate(
            target(
                f"{model} step, 1 shard, int8 push + bf16 pull vs torch.rpc peer fp32",
                ratios[f"hetps-{INT8} vs {PEER}"],
                PEER_INT8,
                True,
                f"the bare mover moving the same bytes: {ratios[f'bare-{INT8} vs {PEER}']['median']:.2f}×, "
                f"and doing the step's arithmetic too: {ratios[f'arith-{INT8} vs {PEER}']['median']:.2f}×",
            ),
            peer,
            validity,
        ),
        bytes_target(model, steps[model]["systems"]),
    ]
    for name in settings.models:
        for key, summary in steps[name]["speed_ratios"].items():
            first, other = key.split(" vs ")
            if first.startswith("hetps-") and other.startswith("bare-"):
                system = first.removeprefix("hetps-")
                judged = target(f"{name} step {system} vs bare gRPC", summary, BARE_FRACTION, True)
                targets.append(invalidate(judged, [f"{name}:{other}"], validity))
    return targets


def step_limits(steps: dict[str, Any], validity: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per model and row (shards and wire dtypes) with an ``arith`` system, the median speed ratios
    of hetps and of the bare mover doing the step's arithmetic against the bare mover, each other
    and the peer, and which of those baselines did not hold still (``validity``). Where "arith vs
    bare" is under the 0.9x target, or "arith vs peer" under the peer's, no server doing the step's
    arithmetic with this design reaches it on this machine."""
    limits: dict[str, dict[str, dict[str, Any]]] = {}
    out_of_line = set(validity["out_of_line"])
    for model, data in steps.items():
        ratios = data["speed_ratios"]
        rows = [name.removeprefix("arith-") for name in data["systems"] if name.startswith("arith-")]
        limits[model] = {
            row: {
                "hetps vs bare": ratios[f"hetps-{row} vs bare-{row}"]["median"],
                "arith vs bare": ratios[f"arith-{row} vs bare-{row}"]["median"],
                "hetps vs arith": ratios[f"hetps-{row} vs arith-{row}"]["median"],
                "hetps vs peer": ratios[f"hetps-{row} vs {PEER}"]["median"],
                "arith vs peer": ratios[f"arith-{row} vs {PEER}"]["median"],
                # Where an overlap row was measured (1 shard).
                "overlap vs arith": ratios.get(f"overlap-{row} vs arith-{row}", {}).get("median"),
                "out_of_line": sorted(
                    name
                    for name in (f"bare-{row}", f"arith-{row}", f"overlap-{row}", PEER)
                    if f"{model}:{name}" in out_of_line
                ),
            }
            for row in rows
        }
    return limits


def bytes_target(model: str, systems: dict[str, Any]) -> dict[str, Any]:
    """Bytes per step (both directions, payloads) of an 8-bit push with a bf16 pull against fp32's."""
    ratio = systems[f"hetps-{INT8}"]["wire_bytes_each_way"] / systems["hetps-1shard-fp32"]["wire_bytes_each_way"]
    exact: Summary = {"median": ratio, "min": ratio, "max": ratio, "q1": ratio, "q3": ratio, "n": 1}
    return target(f"{model} bytes per step, int8 push + bf16 pull vs fp32", exact, INT8_BYTES, False)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    settings, out = parse_settings("step_round_trip", __doc__, argv, repeats=True)
    console, log_dir = prepare_output(out)
    torch.set_num_threads(TORCH_THREADS)
    started = time.perf_counter()
    results = run_header(settings)
    fleet = Fleet(log_dir)
    comparisons: Comparisons | None = None
    try:
        with console.status("starting servers"):
            hetps = hetps_addresses(settings, fleet.start_all(hetps_jobs(settings)))
            comparisons = start_comparisons(fleet)
        server_pids = {server.address: server.pid for server in fleet.servers} | comparisons.pids()
        movers = comparisons.mover_addresses()
        results["steps"] = measure_steps(settings, hetps, movers, server_pids, console, comparisons.remote)
        comparisons.leave()
        comparisons = None
    finally:
        if comparisons is not None:
            comparisons.leave(graceful=False)
        fleet.stop()
    results["validity"] = step_validity(settings, results["steps"])
    results["targets"] = step_targets(settings, results["steps"], results["validity"])
    results["limits"] = step_limits(results["steps"], results["validity"])
    results["wall_seconds"] = time.perf_counter() - started
    print_step_tables(results["steps"], console)
    print_step_limits(results["limits"], console)
    print_validity(results["validity"], console)
    print_targets(results["targets"], console)
    write_results("step_round_trip", argv, results, out, console)
    return results


if __name__ == "__main__":
    apply_allocator(WORKER)
    main()
