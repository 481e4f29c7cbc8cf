"""What replication costs and how fast a shard fails over.

    python -m benchmarks.replication [--quick] [--smoke] [--kills N] [--out benchmarks/results/replication.json]

Needs Debian's etcd-server (``/usr/bin/etcd``); one etcd is started for the run.

**Cost.** One worker in this process steps (push a fixed gradient, get the parameters back:
``ParameterServerOptimizer.step``) against a lone server and against a replicated one (a primary
and one backup, each its own process), interleaved round by round in a fresh order so both see the
same load. Target: the replicated step at most 1.5x the lone one (the median of the rounds' ratios).

Before the steps, the servers and etcd are left idle for a while: the CPU each uses then is what a
replica set costs while nothing happens (lease renewals, etcd's watch, the reads it wakes).

**Sustained rate.** Several workers (threads of this process, a small model) push many steps each
against a lone server and a replicated pair, one system after the other: the update rate in the
run's last quarter against its first. A version carries every worker's push-id memory, so a cost
that grows with it would show as a falling rate once the memories fill (after
``RECENT_PUSHES_KEPT`` pushes a worker). Target: the replicated pair's last quarter at least
0.7x its first (the quarters of a steady run differ by up to 15 % on a 2-core host).

**Failover.** A worker in this process steps without pause against a shard of three replicas (its
``--server`` is the replica set); the primary is killed with SIGKILL at a random moment, ``--kills``
times (5), between two of its steps. The time from each kill to the first step acknowledged after it
(by the new primary) is recorded; the killed replica is started again and the next kill waits until it is back in sync.
Target: at most 3 s, median and worst. After the last, the acknowledged steps equal the pushes the
primary has applied (exactly once across every failover).
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import torch
from torch import nn

from benchmarks.harness.models import resnet18_shapes, tiny_shapes
from benchmarks.harness.processes import Fleet, HetpsJob, ServerProcess, cpu_seconds
from benchmarks.harness.report import prepare_output, run_header, write_results
from benchmarks.harness.stats import summarize
from psproto.v1 import ps_pb2, ps_pb2_grpc
from pstools.etcd import LocalEtcd, free_ports
from psworker.optim import ParameterServerOptimizer

COST_TARGET = 1.5
STEADY_TARGET = 0.7
FAILOVER_TARGET_S = 3.0
IN_SYNC_TIMEOUT_S = 60.0


@dataclass
class Run:
    rounds: int
    steps_per_round: int
    kills: int
    model: str
    sustained_workers: int
    sustained_steps: int
    idle_seconds: float


def _status(address: str) -> ps_pb2.StatusResponse:
    with grpc.insecure_channel(address) as channel:
        reply: ps_pb2.StatusResponse = ps_pb2_grpc.ParameterServerStub(channel).Status(
            ps_pb2.StatusRequest(), timeout=5
        )
        return reply


def _model(name: str) -> nn.Module:
    shapes = resnet18_shapes() if name == "resnet18" else tiny_shapes()
    torch.manual_seed(0)
    return nn.ParameterList([nn.Parameter(torch.randn(shape) * 0.01) for _, shape in shapes])


def _stepper(model: nn.Module, servers: str, name: str) -> tuple[ParameterServerOptimizer, Any]:
    optimizer = ParameterServerOptimizer(model, servers, name=name)
    gradients = [torch.randn_like(parameter) * 1e-3 for parameter in model.parameters()]

    def step() -> float:
        for parameter, gradient in zip(model.parameters(), gradients, strict=True):
            parameter.grad = gradient.clone()
        started = time.perf_counter()
        optimizer.step()
        return time.perf_counter() - started

    return optimizer, step


def _job(label: str, model: str, etcd: str | None, port: int = 0) -> HetpsJob:
    """A one-shard ASGD server; with ``etcd`` one replica of the job the URL names; on ``port`` (0: any)
    so that a restart comes back where the worker's replica set says."""
    extra = ("--etcd", etcd) if etcd is not None else ()
    return HetpsJob(label, model, "asgd", (), 0, 1, extra_args=(*extra, "--port", str(port)))


def _primary(servers: Sequence[ServerProcess]) -> ServerProcess:
    deadline = time.monotonic() + IN_SYNC_TIMEOUT_S
    while time.monotonic() < deadline:
        for server in servers:
            if server.process.poll() is None and _status(server.address).replica.role == "primary":
                return server
        time.sleep(0.1)
    raise RuntimeError("no replica became primary")


def _wait_in_sync(primary: ServerProcess, backups: int) -> None:
    deadline = time.monotonic() + IN_SYNC_TIMEOUT_S
    while time.monotonic() < deadline:
        replica = _status(primary.address).replica
        if sum(backup.in_sync for backup in replica.backups) >= backups:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{primary.label}: {backups} backup(s) not in sync after {IN_SYNC_TIMEOUT_S} s")


def _idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Each process's CPU over ``seconds`` of nothing asked of it, as a percentage of one core."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {name: 100 * (cpu_seconds(pid) - before[name]) / seconds for name, pid in pids.items()}


def cost(run: Run, fleet: Fleet, etcd: LocalEtcd) -> dict[str, Any]:
    lone = fleet.start_hetps(_job("lone", run.model, None))
    pair = fleet.start_all([_job(f"replica-{i}", run.model, f"{etcd.url}/cost") for i in range(2)])
    primary = _primary(list(pair.values()))
    _wait_in_sync(primary, 1)
    (backup,) = [server for server in pair.values() if server is not primary]
    processes = {"lone": lone.pid, "primary": primary.pid, "backup": backup.pid, "etcd": etcd.process.pid}
    idle = {"seconds": run.idle_seconds, "percent_of_a_core": _idle_cpu(processes, run.idle_seconds)}
    systems = {
        "lone": _stepper(_model(run.model), lone.address, "cost-lone"),
        "one backup": _stepper(_model(run.model), primary.address, "cost-replicated"),
    }
    for _, step in systems.values():
        for _ in range(5):
            step()
    times: dict[str, list[float]] = {name: [] for name in systems}
    ratios = []
    for _ in range(run.rounds):
        order = list(systems)
        random.shuffle(order)
        medians = {}
        for name in order:
            took = [systems[name][1]() for _ in range(run.steps_per_round)]
            times[name] += took
            medians[name] = statistics.median(took)
        ratios.append(medians["one backup"] / medians["lone"])
    for optimizer, _ in systems.values():
        optimizer.close()
    return {
        "idle": idle,
        "step_ms": {name: summarize([t * 1e3 for t in took]) for name, took in times.items()},
        "ratio": summarize(ratios),
        "target": {"at_most": COST_TARGET, "pass": statistics.median(ratios) <= COST_TARGET},
    }


def _quarter_rates(finished: list[float]) -> list[float]:
    """Updates a second in each quarter of the run, by the steps' completion times."""
    times = sorted(finished)
    edges = [round(i * (len(times) - 1) / 4) for i in range(5)]
    return [(edges[i + 1] - edges[i]) / max(times[edges[i + 1]] - times[edges[i]], 1e-9) for i in range(4)]


def _run_workers(servers: str, run: Run, label: str) -> list[float]:
    """Each worker's steps' completion times; every worker steps a few times first (joined, warm)."""
    steppers = [_stepper(_model("tiny"), servers, f"{label}-{i}") for i in range(run.sustained_workers)]
    for _, step in steppers:
        for _ in range(3):
            step()
    finished: list[float] = []
    start = threading.Barrier(len(steppers))

    def work(step: Any) -> None:
        start.wait()
        for _ in range(run.sustained_steps):
            step()
            finished.append(time.monotonic())

    threads = [threading.Thread(target=work, args=(step,)) for _, step in steppers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for optimizer, _ in steppers:
        optimizer.close()
    return finished


def sustained(run: Run, fleet: Fleet, etcd: LocalEtcd) -> dict[str, Any]:
    lone = fleet.start_hetps(_job("sustained-lone", "tiny", None))
    pair = fleet.start_all([_job(f"sustained-{i}", "tiny", f"{etcd.url}/sustained") for i in range(2)])
    primary = _primary(list(pair.values()))
    _wait_in_sync(primary, 1)
    systems: dict[str, dict[str, Any]] = {}
    for name, address in (("lone", lone.address), ("one backup", primary.address)):
        finished = _run_workers(address, run, f"sustained-{name.replace(' ', '-')}")
        quarters = _quarter_rates(finished)
        systems[name] = {
            "updates": len(finished),
            "updates_per_s": len(finished) / (max(finished) - min(finished)),
            "quarter_updates_per_s": quarters,
            "last_over_first": quarters[-1] / quarters[0],
        }
    steady = systems["one backup"]["last_over_first"]
    return {
        **systems,
        "replicated_over_lone_rate": systems["one backup"]["updates_per_s"] / systems["lone"]["updates_per_s"],
        "target": {"last_over_first_at_least": STEADY_TARGET, "pass": steady >= STEADY_TARGET},
    }


def failover(run: Run, fleet: Fleet, etcd: LocalEtcd) -> dict[str, Any]:
    jobs = [_job(f"failover-{i}", "tiny", f"{etcd.url}/failover", port) for i, port in enumerate(free_ports(3))]
    replicas = list(fleet.start_all(jobs).values())
    first_epoch = _status(_primary(replicas).address).replica.epoch
    _wait_in_sync(_primary(replicas), 2)
    servers = "|".join(server.address for server in replicas)
    optimizer, step = _stepper(_model("tiny"), servers, "failover-worker")
    acked: list[float] = []
    stop = threading.Event()
    # Held by the worker while it steps: a kill taken with it falls between two steps, so every step
    # acknowledged after the kill went through the failover.
    stepping = threading.Lock()

    def keep_stepping() -> None:
        while not stop.is_set():
            with stepping:
                step()
                acked.append(time.monotonic())

    stepper = threading.Thread(target=keep_stepping, daemon=True)
    stepper.start()
    latencies = []
    for _ in range(run.kills):
        time.sleep(random.uniform(0.5, 1.5))
        primary = _primary(replicas)
        with stepping:
            primary.process.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
        primary.process.wait()
        while not any(at > killed_at for at in acked[-50:]):
            if not stepper.is_alive():
                raise RuntimeError("the worker stopped")
            time.sleep(0.01)
        latencies.append(next(at for at in acked if at > killed_at) - killed_at)
        index = replicas.index(primary)
        fleet.servers.remove(primary)
        replicas[index] = fleet.start_hetps(jobs[index])
        _wait_in_sync(_primary(replicas), 2)
    stop.set()
    stepper.join()
    optimizer.close()
    final = _status(_primary(replicas).address)
    summary = summarize(latencies)
    return {
        "kill_to_first_ack_s": latencies,
        "summary": summary,
        "acknowledged_steps": len(acked),
        "applied_pushes": final.applied_pushes,
        "clock": final.clock,
        "failovers_seen": final.replica.epoch - first_epoch,
        "worker_follows": optimizer.client.stats.follows,
        "exactly_once": final.applied_pushes == len(acked),
        "target": {
            "at_most_s": FAILOVER_TARGET_S,
            "pass": summary["median"] <= FAILOVER_TARGET_S and summary["max"] <= FAILOVER_TARGET_S,
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, two rounds, one kill (tests)")
    parser.add_argument("--kills", type=int, default=None, help="primaries killed (default 5; 1 with --smoke)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/replication.json"))
    args = parser.parse_args(argv)
    if shutil.which("etcd") is None:
        parser.error("etcd is not installed (Debian: apt-get install etcd-server)")
    run = Run(
        rounds=2 if args.smoke else 6 if args.quick else 12,
        steps_per_round=3 if args.smoke else 5,
        kills=args.kills if args.kills is not None else 1 if args.smoke else 5,
        model="tiny" if args.smoke else "resnet18",
        sustained_workers=2 if args.smoke else 4,
        sustained_steps=80 if args.smoke else 150 if args.quick else 400,
        idle_seconds=1.0 if args.smoke else 10.0,
    )
    console, log_dir = prepare_output(args.out)
    started = time.monotonic()
    results: dict[str, Any] = {**run_header(None), "run": run.__dict__}
    fleet = Fleet(log_dir)
    shutil.rmtree(log_dir / "etcd", ignore_errors=True)  # a fresh etcd: epochs count this run's failovers
    with LocalEtcd(log_dir / "etcd") as etcd:
        try:
            for section, measure in (("cost", cost), ("sustained", sustained), ("failover", failover)):
                results[section] = measure(run, fleet, etcd)
                fleet.stop()
                fleet = Fleet(log_dir)
        finally:
            fleet.stop()
    results["wall_seconds"] = time.monotonic() - started
    for section in ("cost", "sustained", "failover"):
        console.print(section, results[section])
    write_results("replication", argv, results, args.out, console)


if __name__ == "__main__":
    main()
