"""Two shards and compressed wire dtypes train as well as one shard in fp32."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from pstasks.tasks import load_task
from pstools.launcher import ClusterConfig, ClusterError, ClusterReport, run_cluster
from psworker.binding import ModelBinding
from psworker.client import NO_RETRY, ClientConfig, PSClient, ServerMismatchError
from tests.integration.conftest import StartServer
from tests.integration.workers import WarmTrain

pytestmark = pytest.mark.integration


def test_two_shards_with_bf16_on_the_wire_train_digits_as_well_as_one_shard_in_fp32(tmp_path: Path) -> None:
    def train(shards: int, wire_dtype: str) -> ClusterReport:
        return run_cluster(
            ClusterConfig(
                workers=2,
                slowdowns=(1.0, 2.0),
                shards=shards,
                wire_dtype=wire_dtype,
                until_clock=1000,
                log_dir=tmp_path / f"{shards}-{wire_dtype}",
            )
        )

    one, two = train(1, "fp32"), train(2, "bf16")
    print(f"one shard in fp32 {one.test_accuracy:.4f}, two shards in bf16 {two.test_accuracy:.4f}")
    assert two.test_accuracy >= 0.90
    # Asynchronous runs differ in their interleaving, not in what they reach.
    assert abs(two.test_accuracy - one.test_accuracy) <= 0.05
    # Each shard keeps its own clock; the report shows the slowest, and every shard got every push.
    assert two.clock >= 1000
    assert all(w.pushes > 0 for w in two.workers)


def test_a_model_that_cannot_be_split_so_is_refused_before_any_process_starts(tmp_path: Path) -> None:
    # The digits CNN has 8 tensors; shards are cut at tensor boundaries.
    with pytest.raises(ClusterError, match="--task digits with --shards 9: 9 shards for 8 tensors"):
        run_cluster(ClusterConfig(workers=1, slowdowns=(1.0,), shards=9, log_dir=tmp_path / "logs"))
    assert not (tmp_path / "logs").exists()


def _joined(stub: ps_pb2_grpc.ParameterServerStub) -> list[str]:
    return [w.worker_name for w in stub.Status(ps_pb2.StatusRequest(), timeout=10).workers]


def test_a_worker_refused_by_one_shard_leaves_the_shards_it_had_joined(
    start_psserver: StartServer, stub_for: Callable[[str], ps_pb2_grpc.ParameterServerStub], tmp_path: Path
) -> None:
    first, second = (start_psserver("asgd", lr=0.1, shard_index=i, num_shards=2) for i in range(2))
    layout = ModelBinding(load_task("digits").build_model(), num_shards=2).layout
    # A record left behind would hold a BSP barrier until its lease ran out.
    # Listed out of order: the first server reached accepts the Join but answers shard 1.
    with pytest.raises(ServerMismatchError, match="list the servers in shard order"):
        PSClient([second, first], layout, name="misordered", config=ClientConfig(retry=NO_RETRY))
    assert _joined(stub_for(first)) == [] and _joined(stub_for(second)) == []
    # Shard 0 accepts; shard 1 already holds another model and refuses: shard 0 is left again.
    accepting, holding = (start_psserver("asgd", lr=0.1, shard_index=i, num_shards=2) for i in range(2))
    other_model = Layout.from_named_shapes([("x", (3,)), ("y", (5,))], 2)
    stub_for(holding).Join(
        ps_pb2.JoinRequest(worker_name="other", layout=other_model.to_proto(), layout_hash=other_model.hash),
        timeout=10,
    )
    with pytest.raises(grpc.RpcError) as refused:
        PSClient([accepting, holding], layout, name="refused", config=ClientConfig(retry=NO_RETRY))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert _joined(stub_for(accepting)) == [] and _joined(stub_for(holding)) == ["other"]
    # The command says so in one line, with no traceback.
    config = tmp_path / "no-retry.toml"
    config.write_text("[train.client.retry]\ngive_up_seconds = 0\n")
    command = [sys.executable, "-m", "psworker", "train", "--server", second, "--server", first]
    command += ["--config", str(config)]
    worker = WarmTrain(command, tmp_path / "misordered.out")
    output, _ = worker.communicate(timeout=120)
    assert worker.returncode == 1, output
    assert "Error:" in output and "list the servers in shard order" in output
    assert "Traceback" not in output
    assert _joined(stub_for(first)) == [] and _joined(stub_for(second)) == []
