"""Workers given a shard's replica set find its primary: a real ``psserver serve`` behind a backup
that refuses with NOT_PRIMARY naming it, or behind a replica that is down (a closed port). Each
worker trains, and the primary applies every push once."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest

from psproto.v1 import ps_pb2, ps_pb2_grpc
from tests.integration.not_primary import closed_port, not_primary_server
from tests.integration.workers import start_train, train_command

pytestmark = pytest.mark.integration

STEPS = 30


def test_python_workers_follow_a_backup_to_the_primary_and_go_past_a_replica_that_is_down(
    start_psserver: Callable[..., str], stub_for: Callable[[str], ps_pb2_grpc.ParameterServerStub]
) -> None:
    primary = start_psserver("asgd", 0.1)
    down = closed_port()
    with not_primary_server(primary) as backup:
        workers = {
            "via-backup": start_train(
                train_command(f"{backup.address}|{primary}", "via-backup", 10**6, extra=("--max-steps", str(STEPS)))
            ),
            "via-down": start_train(
                train_command(f"{down}|{primary}", "via-down", 10**6, seed=1, extra=("--max-steps", str(STEPS)))
            ),
        }
        summaries = {}
        for name, worker in workers.items():
            try:
                out, err = worker.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                worker.kill()
                out, err = worker.communicate()
            assert worker.returncode == 0, f"{name}:\n{err}"
            summaries[name] = json.loads(out.strip().splitlines()[-1])
            # One line per switch, naming the shard, both addresses and why.
            first = backup.address if name == "via-backup" else down
            why = "not the primary" if name == "via-backup" else "no answer"
            assert f"shard 0 at {first}: {why}" in err and f"switched to {primary}" in err, err
        # The backup was asked (the first Join), refused, and asked nothing more.
        assert backup.refused == {"Join": 1}
    for name, summary in summaries.items():
        assert summary["steps"] == summary["pushes"] == STEPS, summary
        assert summary["follows"] == 1 and summary["rejoins"] == 0 and summary["duplicate_acks"] == 0, (name, summary)
    status = stub_for(primary).Status(ps_pb2.StatusRequest(), timeout=10)
    # Every push of both workers applied once (ASGD: one update per push), none refused.
    assert status.applied_pushes == status.clock == 2 * STEPS
    assert sum(status.rejected.values()) == 0
    assert not status.workers  # both left at the end
