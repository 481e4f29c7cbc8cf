"""Faults with real processes on 127.0.0.1: a shard killed and restored, workers killed or frozen
past their lease, and a proxy that drops and delays connections."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from psserver.core.checkpoint import list_checkpoints
from pstasks.tasks import load_task
from pstools.launcher import start_server
from pstools.warm_start import Program, stop_process
from psworker.task import evaluate
from tests.integration.probes import status, wait_for
from tests.integration.tcp_proxy import TcpProxy
from tests.integration.workers import WarmTrain, train_command

pytestmark = pytest.mark.integration


def start_worker(
    address: str, name: str, log: Path, until_clock: int, slowdown: float = 1.0, seed: int = 0
) -> WarmTrain:
    command = train_command(
        address,
        name,
        until_clock,
        seed=seed,
        slowdown=slowdown,
        log=log,
        settings={"train": {"client": {"retry": {"give_up_seconds": 120}}}},
    )
    return WarmTrain(command, log.with_suffix(".out"))


def finish(process: WarmTrain, timeout: float = 180) -> dict[str, object]:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"worker did not finish in {timeout} s: {err[-2000:]}") from None
    assert process.returncode == 0, err[-3000:]
    summary: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return summary


CHECKPOINT_EVERY = 100


def test_a_shard_killed_mid_training_resumes_from_its_checkpoint(tmp_path: Path, processes: list[Program]) -> None:
    """kill -9 the shard, restart it on the same port: training finishes above 90 %, and the
    updates lost are at most one checkpoint interval (plus those applied while it was written)."""
    ckpt = tmp_path / "ckpt"
    args = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", str(CHECKPOINT_EVERY)]
    server, address = start_server(tmp_path, "asgd", 0.05, (), extra_args=args)
    processes.append(server)
    port = address.rsplit(":", 1)[1]
    workers = [start_worker(address, f"w{i}", tmp_path / f"w{i}.jsonl", 1000, 1.0 + i, i) for i in range(2)]
    processes.extend(workers)
    wait_for(lambda: status(address).clock >= 450, 120, "clock 450 before the kill")
    server.send_signal(signal.SIGKILL)
    server.wait()
    newest = list_checkpoints(ckpt)[-1][1]
    time.sleep(1.0)  # the workers see the shard gone and retry
    restarted, again = start_server(
        tmp_path, "asgd", 0.05, (), extra_args=[*args, "--port", port], log_name="server-restarted.log"
    )
    processes.append(restarted)
    assert again == address
    log = (tmp_path / "server-restarted.log").read_text()
    restored = int(re.search(r"restored checkpoint \S+: clock (\d+)", log).group(1))  # type: ignore[union-attr]
    assert restored == newest and restored % CHECKPOINT_EVERY == 0

    summaries = [finish(w) for w in workers]
    rollbacks = [r for s in summaries for r in s["rollbacks"]]  # type: ignore[attr-defined]
    assert rollbacks, summaries
    seen_before_kill = max(seen for _, seen, _ in rollbacks)
    lost = seen_before_kill - restored
    print(f"\nshard killed at clock >= {seen_before_kill}, restored clock {restored}: {lost} acknowledged updates lost")
    # Captures are taken inside the update that reaches a multiple of the interval; a few more can
    # land while that capture is being written.
    assert 0 <= lost <= CHECKPOINT_EVERY + 10
    for summary in summaries:
        assert summary["test_accuracy"] >= 0.90, summary
        assert summary["final_clock"] >= 1000
    assert sum(int(s["rejoins"]) for s in summaries) == 0  # worker ids came back with the checkpoint
    assert stop_process(restarted) == 0  # SIGTERM writes a final checkpoint

    final_clock = list_checkpoints(ckpt)[-1][1]
    assert final_clock >= 1000
    out = tmp_path / "model.safetensors"
    exported = subprocess.run(
        [sys.executable, "-m", "psworker", "export", "--checkpoint", str(ckpt), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exported.returncode == 0, exported.stderr
    from safetensors.torch import load_file

    task = load_task("digits")
    model = task.build_model()
    model.load_state_dict(load_file(str(out)))
    accuracy, _ = evaluate(model, task, torch.device("cpu"))
    assert accuracy >= 0.90


@pytest.mark.parametrize("consistency", ["ssp", "bsp"])
def test_a_killed_worker_never_holds_the_others_past_the_lease(
    consistency: str, tmp_path: Path, processes: list[Program]
) -> None:
    lease = 3.0
    server, address = start_server(
        tmp_path,
        "asgd",
        0.05,
        (),
        extra_args=["--consistency", consistency, "--ssp-bound", "1"],
        config={"shard": {"lease_seconds": float(lease)}},
    )
    processes.append(server)
    workers = [start_worker(address, f"w{i}", tmp_path / f"w{i}.jsonl", 400, seed=i) for i in range(3)]
    processes.extend(workers)
    # Every worker has joined before one is killed: a worker killed while still starting would never
    # be in the barrier, and the others would go on without any eviction.
    wait_for(lambda: len(status(address).workers) == 3 and status(address).clock >= 40, 120, "training to start")
    workers[2].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    clock = status(address).clock
    # The survivors wait at most for the lease (plus the reaper's tick) before going on.
    wait_for(lambda: status(address).clock >= clock + 10, lease + 10, "progress after the kill")
    resumed_after = time.monotonic() - killed_at
    print(f"\n{consistency}: progress resumed {resumed_after:.1f} s after kill -9 (lease {lease} s)")
    wait_for(lambda: len(status(address).workers) == 2, lease + 10, "the eviction")

    if consistency == "ssp":
        # A worker frozen past its lease is evicted; thawed, it re-joins and finishes.
        workers[1].send_signal(signal.SIGSTOP)
        wait_for(lambda: len(status(address).workers) == 1, lease + 15, "the frozen worker's eviction")
        workers[1].send_signal(signal.SIGCONT)
    summaries = [finish(w) for w in workers[:2]]
    assert all(int(s["final_clock"]) >= 400 for s in summaries)
    if consistency == "ssp":
        assert int(summaries[1]["rejoins"]) >= 1, summaries[1]
    evictions = (tmp_path / "server-0.log").read_text().count("evicted worker")
    assert evictions >= 1
    assert stop_process(server) == 0


def test_every_acknowledged_push_is_applied_exactly_once_through_a_flaky_network(
    tmp_path: Path, processes: list[Program]
) -> None:
    server, address = start_server(tmp_path, "asgd", 0.05, ())
    processes.append(server)
    host, port = address.rsplit(":", 1)
    proxy = TcpProxy((host, int(port)), seed=7)
    try:
        through = f"127.0.0.1:{proxy.port}"
        workers = [start_worker(through, f"w{i}", tmp_path / f"w{i}.jsonl", 400, seed=i) for i in range(2)]
        processes.extend(workers)
        summaries = [finish(w, timeout=200) for w in workers]
    finally:
        proxy.close()
    reply = status(address)
    acknowledged = sum(int(s["pushes"]) for s in summaries)
    retries = sum(int(s["retries"]) for s in summaries)
    duplicates = sum(int(s["duplicate_acks"]) for s in summaries)
    print(
        f"\nproxy: {proxy.connections} connections, {proxy.drops} dropped; workers: {acknowledged} pushes "
        f"acknowledged, {retries} retries, {duplicates} acknowledged as duplicates; server applied "
        f"{reply.applied_pushes} (clock {reply.clock})"
    )
    assert proxy.drops >= 3 and retries >= 1
    assert reply.applied_pushes == acknowledged
    assert reply.clock == acknowledged
    assert stop_process(server) == 0
