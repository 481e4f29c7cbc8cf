"""A Node.js worker (examples/node-worker, @grpc/grpc-js, written against ps.proto only) and a Python
worker train one model together on a live two-shard server: the protocol is language-agnostic. The
Node worker recovers by the same reasons: it re-joins, and follows a replica set to its primary."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psworker.client import PSClient
from tests.integration.not_primary import closed_port, not_primary_server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NODE_WORKER = ROOT / "examples" / "node-worker"
NODE = shutil.which("node")
FEATURES = 8
NODE_STEPS = 150
PYTHON_STEPS = 150
INITIAL_LOSS = math.log(2.0)  # binary cross-entropy of the all-zero model, which predicts 0.5

needs_node = pytest.mark.skipif(NODE is None, reason="node (Node.js) is not installed")


def require_node_modules() -> None:
    if not (NODE_WORKER / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.fail("examples/node-worker/node_modules is missing: run `npm ci` there (`make test` does)")


def layout(num_shards: int) -> Layout:
    # The Node worker's model: logistic regression, `w: [1, F]` then `b: [1]`.
    return Layout.from_named_shapes([("w", (1, FEATURES)), ("b", (1,))], num_shards)


def python_worker(addresses: list[str], steps: int, losses: list[float], errors: list[BaseException]) -> None:
    """The same task as the Node worker (y = [w*·x + b* > 0]), its gradient computed with torch."""
    try:
        generator = torch.Generator().manual_seed(42)
        true_w = torch.tensor([(1.0 if j % 2 == 0 else -1.0) * (1 + j / FEATURES) for j in range(FEATURES)])
        x = torch.randn(2048, FEATURES, generator=generator)
        y = (x @ true_w + 0.25 > 0).float()
        params = torch.zeros(FEATURES + 1)
        with PSClient(addresses, layout(len(addresses)), name="python-worker") as client:
            if not client.initialized:
                client.init(params)
            for step in range(steps):
                client.pull(params)
                w, b = params[:FEATURES].clone().requires_grad_(), params[FEATURES:].clone().requires_grad_()
                batch = slice((step * 32) % 2016, (step * 32) % 2016 + 32)
                loss = torch.nn.functional.binary_cross_entropy_with_logits(x[batch] @ w + b, y[batch])
                loss.backward()
                assert w.grad is not None and b.grad is not None
                client.push(torch.cat([w.grad, b.grad]))
                losses.append(loss.item())
    except BaseException as error:  # reported by the test thread
        errors.append(error)


def finished_events(node: subprocess.Popen[str], timeout: float) -> list[dict[str, Any]]:
    """The JSON events a Node worker printed, once it ended with exit code 0 (killed if it runs past ``timeout``)."""
    try:
        stdout, stderr = node.communicate(timeout=timeout)
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
    assert node.returncode == 0, f"node worker failed:\n{stderr}\n{stdout}"
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_node_unit_tests() -> None:
    if NODE is None:
        pytest.skip("node (Node.js) is not installed")
    require_node_modules()
    result = subprocess.run([NODE, "--test", "test/"], cwd=NODE_WORKER, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_node
def test_node_and_python_workers_train_one_model(
    start_psserver: Callable[..., str], stub_for: Callable[[str], ps_pb2_grpc.ParameterServerStub]
) -> None:
    require_node_modules()
    addresses = [start_psserver("asgd", 0.5, shard_index=index, num_shards=2) for index in range(2)]

    losses: list[float] = []
    errors: list[BaseException] = []
    thread = threading.Thread(target=python_worker, args=(addresses, PYTHON_STEPS, losses, errors))
    command = [NODE, "worker.js", "--name", "node-worker", "--steps", str(NODE_STEPS), "--log-every", "10"]
    for address in addresses:
        command += ["--server", address]
    node = subprocess.Popen(command, cwd=NODE_WORKER, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    thread.start()
    try:
        stdout, stderr = node.communicate(timeout=180)
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
        thread.join(180)
    assert node.returncode == 0, f"node worker failed:\n{stderr}\n{stdout}"
    assert not errors, f"python worker failed: {errors[0]!r}"

    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    joined = [e for e in events if e["event"] == "joined"]
    assert [e["shard"] for e in joined] == [0, 1]
    assert {e["rule"] for e in joined} == {"asgd"}
    step_losses = [e["loss"] for e in events if e["event"] == "step"]
    done = next(e for e in events if e["event"] == "done")
    # The Node worker's evaluation loss falls across its log, and to under half the loss of the
    # all-zero initial model (ln 2). Its first logged loss is not the baseline: the Python worker
    # may have trained the shared model for a while before Node.js has started.
    assert len(step_losses) == NODE_STEPS // 10 + 1
    assert step_losses[-1] < INITIAL_LOSS * 0.5, step_losses
    assert done["final_loss"] < done["first_loss"]
    later_halves = step_losses[len(step_losses) // 2 :]
    assert max(later_halves) < step_losses[0], step_losses
    assert done["pushes"] == NODE_STEPS
    # The Python worker, on the same model, learned too.
    assert len(losses) == PYTHON_STEPS
    assert sum(losses[-20:]) / 20 < sum(losses[:5]) / 5

    # Every push of both workers was applied once by each shard (ASGD: one update per push).
    for address in addresses:
        status = stub_for(address).Status(ps_pb2.StatusRequest(), timeout=10)
        assert status.clock == NODE_STEPS + PYTHON_STEPS, address
        assert status.applied_pushes == NODE_STEPS + PYTHON_STEPS
        assert status.layout_hash == layout(2).hash
        assert dict(status.rejected) == {} or sum(status.rejected.values()) == 0


@needs_node
def test_node_worker_sends_the_bearer_token(start_psserver: Callable[..., str], tmp_path: Path) -> None:
    require_node_modules()
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    address = start_psserver("asgd", 0.5, extra_args=("--auth-token-file", str(token)))
    base = [NODE, "worker.js", "--server", address, "--steps", "3", "--log-every", "1"]

    refused = subprocess.run(base, cwd=NODE_WORKER, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    # The status code, and the reason the worker read from the ErrorInfo in the trailers.
    assert "UNAUTHENTICATED (UNAUTHENTICATED)" in refused.stderr

    accepted = subprocess.run(
        [*base, "--auth-token-file", str(token)], cwd=NODE_WORKER, capture_output=True, text=True, timeout=60
    )
    assert accepted.returncode == 0, accepted.stderr
    assert '"event":"done"' in accepted.stdout


@needs_node
def test_node_worker_rejoins_when_the_shard_forgets_it(
    start_psserver: Callable[..., str], stub_for: Callable[[str], ps_pb2_grpc.ParameterServerStub]
) -> None:
    """Its record removed mid-run (as an eviction or a restart would), the Node worker reads the
    reason UNKNOWN_WORKER from its next refusal, joins again and trains on."""
    require_node_modules()
    assert NODE is not None
    address = start_psserver("asgd", 0.5)
    stub = stub_for(address)
    until_clock = 1500
    command = [NODE, "worker.js", "--name", "forgotten", "--server", address, "--steps", "100000"]
    command += ["--until-clock", str(until_clock), "--log-every", "100"]
    node = subprocess.Popen(command, cwd=NODE_WORKER, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            workers = stub.Status(ps_pb2.StatusRequest(), timeout=10).workers
            joined = [w for w in workers if w.worker_name == "forgotten" and w.pushes >= 5]
            if joined:
                break
            time.sleep(0.01)
        assert joined, "the Node worker never pushed"
        stub.Leave(ps_pb2.LeaveRequest(worker_id=joined[0].worker_id), timeout=10)
    except BaseException:
        node.kill()
        node.wait()
        raise
    events = finished_events(node, 120)
    recovered = [e for e in events if e["event"] == "recovering"]
    assert recovered and {(e["reason"], e["action"]) for e in recovered} == {("UNKNOWN_WORKER", "rejoin")}, events
    rejoined = [e for e in events if e["event"] == "rejoined"]
    assert rejoined and rejoined[0]["worker_id"] != joined[0].worker_id
    done = next(e for e in events if e["event"] == "done")
    assert done["clock"] >= until_clock


@needs_node
def test_node_worker_pushes_8_bit_blocks(
    start_psserver: Callable[..., str], stub_for: Callable[[str], ps_pb2_grpc.ParameterServerStub]
) -> None:
    require_node_modules()
    addresses = [start_psserver("asgd", 0.5, shard_index=index, num_shards=2) for index in range(2)]
    steps = 60
    command = [
        NODE,
        "worker.js",
        "--name",
        "node-int8",
        "--steps",
        str(steps),
        "--log-every",
        "20",
        "--push-dtype",
        "int8",
    ]
    for address in addresses:
        command += ["--server", address]
    result = subprocess.run(command, cwd=NODE_WORKER, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"node worker failed:\n{result.stderr}\n{result.stdout}"
    done = next(json.loads(line) for line in result.stdout.splitlines() if '"event":"done"' in line)
    assert done["pushes"] == steps and done["final_loss"] < INITIAL_LOSS * 0.5, done
    for address in addresses:
        status = stub_for(address).Status(ps_pb2.StatusRequest(), timeout=10)
        # Every 8-bit push was decoded and applied; none refused.
        assert status.applied_pushes == steps and sum(status.rejected.values()) == 0, address


@needs_node
def test_node_workers_follow_a_backup_to_the_primary_and_go_past_a_replica_that_is_down(
    start_psserver: Callable[..., str], stub_for: Callable[[str], ps_pb2_grpc.ParameterServerStub]
) -> None:
    """Given a shard as a replica set, the Node worker finds the primary: a backup's NOT_PRIMARY names
    it, a replica that is down (a closed port) is passed for the next one; every push applied once."""
    require_node_modules()
    assert NODE is not None
    primary = start_psserver("asgd", 0.5)
    down = closed_port()
    steps = 20
    with not_primary_server(primary) as backup:
        runs = {
            first: subprocess.Popen(
                [NODE, "worker.js", "--name", f"node-{index}", "--server", f"{first}|{primary}", "--steps", str(steps)],
                cwd=NODE_WORKER,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for index, first in enumerate((backup.address, down))
        }
        for first, node in runs.items():
            events = finished_events(node, 60)
            (followed,) = [e for e in events if e["event"] == "followed"]
            reason = "NOT_PRIMARY" if first == backup.address else None
            assert (followed["from"], followed["to"], followed["reason"]) == (first, primary, reason), followed
            done = next(e for e in events if e["event"] == "done")
            assert done["pushes"] == steps and done["follows"] == 1, done
        assert backup.refused == {"Join": 1}
    status = stub_for(primary).Status(ps_pb2.StatusRequest(), timeout=10)
    assert status.applied_pushes == status.clock == 2 * steps
    assert sum(status.rejected.values()) == 0
