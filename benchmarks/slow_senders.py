"""Honest workers' push rate while clients trickle pushes into the shard's receive buffers.

    python -m benchmarks.slow_senders [--tricklers 0,1,2] [--seconds 4] [--workers 3] [--retry]

One ``psserver serve`` (ASGD, ``shard.receive_buffers = 2``) on loopback. ``--workers`` honest
workers (real ``PSClient``s in this process, one thread each) push a small model's zero
gradient as fast as they can. For each count of trickling clients the honest pushes applied
in ``--seconds`` are counted while that many trickling clients run: each joins under its own
name and sends a push header, then one element (4 bytes) every ``--interval`` seconds, just
inside the server's ``receive_idle_seconds``; with ``--retry`` it sends a new push whenever
one is ended, as a persistent hostile client would (after the backoff of psworker, 0.1 s,
or the ``retry_after_s`` the server gives). Each count's rate is compared with the
rate with no trickler (the first count) measured in the same round (``--repeats`` rounds; the
target: at least half), and each trickling push's end (status code, reason,
the limit that ended it, seconds it lasted) and the server's ``push_stalled`` count are kept.

Prints a table and writes JSON (``--out``, default benchmarks/results/slow_senders.json).
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import torch
from rich.table import Table

from benchmarks.harness.report import prepare_output, print_targets, spread, target, write_results
from benchmarks.harness.stats import summarize
from pscli.config_file import merged
from psproto import codec
from psproto.errors import error_info
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from pstools.launcher import start_server
from pstools.warm_start import stop_process
from psworker.client import ClientConfig, PSClient
from psworker.deadlines import DeadlinePolicy

# 100 000 fp32 parameters: a 400 KB push, a few milliseconds on loopback.
LAYOUT = Layout.from_named_shapes([("w", (250, 400))])
# The server's limits in this measurement: short, so a run takes seconds (the defaults are 30 s,
# 0.1 MiB/s and 5 s); the rate is still 100 times below what loopback moves.
IDLE_S = 1.0
MIN_RATE_MIB_S = 4.0
GRACE_S = 0.5
BASE_CONFIG = {"shard": {"receive_buffers": 2, "receive_idle_seconds": IDLE_S, "lease_seconds": 60.0}}
SERVER_CONFIG = merged(
    BASE_CONFIG, {"shard": {"transfer_pace": {"min_bytes_per_s": MIN_RATE_MIB_S * 2**20, "grace_s": GRACE_S}}}
)


class Trickler(threading.Thread):
    """A client that sends its pushes one element at a time, ``interval_s`` apart; records how each ended."""

    def __init__(self, address: str, name: str, interval_s: float, retry: bool, give_up_s: float = 60.0) -> None:
        super().__init__(name=f"trickler-{name}", daemon=True)
        self._channel = grpc.insecure_channel(address)
        self._stub = ps_pb2_grpc.ParameterServerStub(self._channel)
        self._name = name
        self._interval_s = interval_s
        self._retry = retry
        self._give_up_s = give_up_s
        self.stop = threading.Event()
        self.ends: list[dict[str, Any]] = []

    def run(self) -> None:
        joined = self._stub.Join(
            ps_pb2.JoinRequest(worker_name=self._name, device="cpu", layout=LAYOUT.to_proto(), layout_hash=LAYOUT.hash),
            timeout=10,
        )
        push_id = 0
        while not self.stop.is_set():
            push_id += 1
            end = self._push(joined.worker_id, push_id)
            self.ends.append(end)
            # Back off as psworker does, or as long as the server says: a flood of refused
            # headers would measure this process's GIL, not the server's buffers.
            if not self._retry or self.stop.wait(max(0.1, end["retry_after_s"])):
                break

    def _messages(self, worker_id: int, push_id: int) -> Iterator[ps_pb2.PushRequest]:
        header = ps_pb2.PushHeader(
            worker_id=worker_id, push_id=push_id, kind=ps_pb2.PAYLOAD_KIND_GRADIENT, layout_hash=LAYOUT.hash
        )
        yield ps_pb2.PushRequest(header=header)
        # Trickles until the server ends the push, even once told to stop: its end is what is measured.
        for chunk in codec.encode(torch.zeros(LAYOUT.total_length), chunk_bytes=4):
            yield ps_pb2.PushRequest(chunk=chunk)
            time.sleep(self._interval_s)

    def _push(self, worker_id: int, push_id: int) -> dict[str, Any]:
        started = time.monotonic()
        try:
            self._stub.Push(self._messages(worker_id, push_id), timeout=self._give_up_s)
            code, reason, limit, retry_after_s = "OK", "", "", 0.0
        except grpc.RpcError as error:
            info = error_info(error)
            code = error.code().name
            reason, limit = ("", "") if info is None else (info.reason, info.metadata.get("limit", ""))
            retry_after_s = float(info.metadata.get("retry_after_s", 0.0)) if info is not None else 0.0
        seconds = time.monotonic() - started
        return {"code": code, "reason": reason, "limit": limit, "seconds": seconds, "retry_after_s": retry_after_s}

    def finish(self, timeout_s: float) -> None:
        """Send no new push; wait ``timeout_s`` for the current one to be ended, then close the channel."""
        self.stop.set()
        self.join(timeout_s)
        self._channel.close()


class HonestWorkers:
    """``count`` real clients pushing zero gradients back to back; ``pushes`` counts the applied ones."""

    def __init__(self, address: str, count: int) -> None:
        self.clients = [
            PSClient(
                address, LAYOUT, name=f"honest-{i}", config=ClientConfig(deadlines=DeadlinePolicy(base_seconds=30.0))
            )
            for i in range(count)
        ]
        self.clients[0].init(torch.zeros(LAYOUT.total_length))
        self.pushes = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(c,), daemon=True) for c in self.clients]
        for thread in self._threads:
            thread.start()

    def _run(self, client: PSClient) -> None:
        gradient = torch.zeros(LAYOUT.total_length)
        while not self._stop.is_set():
            try:
                client.push(gradient)
            except grpc.RpcError as error:
                self.errors.append(f"{error.code().name}: {error.details()}")
                return
            with self._lock:
                self.pushes += 1

    def rate(self, seconds: float) -> float:
        """Applied pushes a second over the next ``seconds``."""
        first, started = self.pushes, time.monotonic()
        time.sleep(seconds)
        return (self.pushes - first) / (time.monotonic() - started)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        for client in self.clients:
            client.close()


def stalled_count(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        status = ps_pb2_grpc.ParameterServerStub(channel).Status(ps_pb2.StatusRequest(), timeout=10)
        return int(status.rejected["push_stalled"])


def measure(
    address: str, workers: int, tricklers: Sequence[int], seconds: float, interval_s: float, retry: bool, repeats: int
) -> list[dict[str, Any]]:
    """One row per count of tricklers: the honest rate with them running (each repeat measures
    every count in turn, so a busy machine weighs on all alike), and how their pushes ended."""
    honest = HonestWorkers(address, workers)
    rates: dict[int, list[float]] = {count: [] for count in tricklers}
    ratios: dict[int, list[float]] = {count: [] for count in tricklers}
    ends: dict[int, list[dict[str, Any]]] = {count: [] for count in tricklers}
    counted = dict.fromkeys(tricklers, 0)
    try:
        honest.rate(min(1.0, seconds))  # warm-up: connections, the first pushes
        for repeat in range(repeats):
            for count in tricklers:
                stalled_before = stalled_count(address)
                clients = [Trickler(address, f"trickler-{repeat}-{count}-{i}", interval_s, retry) for i in range(count)]
                for client in clients:
                    client.start()
                rate = honest.rate(seconds)
                for client in clients:
                    # A push ended by the server learns it at its next chunk, one interval later.
                    client.finish(GRACE_S + 2 * interval_s + 5.0)
                rates[count].append(rate)
                base = rates[tricklers[0]][-1]
                ratios[count].append(rate / base if base else 0.0)
                ends[count].extend(end for client in clients for end in client.ends)
                counted[count] += stalled_count(address) - stalled_before
    finally:
        honest.close()
    if honest.errors:
        raise RuntimeError(f"an honest worker failed: {honest.errors[0]}")
    return [
        {
            "tricklers": count,
            "pushes_per_s": summarize(rates[count]),
            "vs_alone": summarize(ratios[count]),
            "trickling_pushes": ends[count],
            "push_stalled_counted": counted[count],
        }
        for count in tricklers
    ]


def print_table(rows: list[dict[str, Any]], console: Any) -> None:
    title = f"Honest push rate with trickling clients (receive_buffers = 2, {MIN_RATE_MIB_S} MiB/s; median, min–max)"
    table = Table(title=title)
    for column in ("tricklers", "honest pushes/s", "vs alone", "trickling pushes ended (code/reason/limit)", "counted"):
        table.add_column(column, justify="right")
    for row in rows:
        ends: dict[str, int] = {}
        for end in row["trickling_pushes"]:
            key = "/".join(part for part in (end["code"], end["reason"], end["limit"]) if part)
            ends[key] = ends.get(key, 0) + 1
        rate, ratio = row["pushes_per_s"], row["vs_alone"]
        table.add_row(
            str(row["tricklers"]),
            f"{rate['median']:.0f} ({spread(rate, 0)})",
            f"{ratio['median']:.2f} ({spread(ratio, 2)})",
            ", ".join(f"{n}× {key}" for key, n in ends.items()) or "-",
            str(row["push_stalled_counted"]),
        )
    console.print(table)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tricklers", default="0,1,2", help="comma-separated counts; the first is the base")
    parser.add_argument("--workers", type=int, default=3, help="honest workers")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per count")
    parser.add_argument("--interval", type=float, default=0.8 * IDLE_S, help="seconds between a trickler's chunks")
    parser.add_argument("--retry", action="store_true", help="tricklers send a new push whenever one is ended")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over every count")
    parser.add_argument(
        "--server-source",
        type=Path,
        default=None,
        help="serve from this source tree (e.g. `git archive` of an older commit); a tree without "
        "psserver/core/pace.py gets the flags it knows only",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/slow_senders.json"))
    args = parser.parse_args(argv)
    counts = [int(part) for part in args.tricklers.split(",")]
    console, log_dir = prepare_output(args.out)
    started = time.perf_counter()
    server_config, environment = SERVER_CONFIG, None
    if args.server_source is not None:
        # PYTHONSAFEPATH: the working directory must not come before the tree on the path.
        environment = {"PYTHONPATH": str(args.server_source.resolve()), "PYTHONSAFEPATH": "1"}
        if not (args.server_source / "psserver/core/pace.py").exists():
            server_config = BASE_CONFIG
    process, address = start_server(log_dir, "asgd", 0.01, (), environment=environment, config=server_config)
    try:
        rows = measure(address, args.workers, counts, args.seconds, args.interval, args.retry, args.repeats)
    finally:
        stop_process(process)
    results: dict[str, Any] = {
        "server_config": server_config,
        "server_source": str(args.server_source or "."),
        "parameters": LAYOUT.total_length,
        "workers": args.workers,
        "seconds": args.seconds,
        "interval_s": args.interval,
        "retry": args.retry,
        "repeats": args.repeats,
        "rows": rows,
        "targets": [
            target(f"honest rate with {row['tricklers']} trickler(s) / alone", row["vs_alone"], 0.5, at_least=True)
            for row in rows[1:]
        ],
        "wall_seconds": time.perf_counter() - started,
    }
    print_table(rows, console)
    print_targets(results["targets"], console)
    write_results("slow_senders", argv, results, args.out, console)
    return results


if __name__ == "__main__":
    main()
