"""A replica's gate and standing, without etcd: the coordinator is a stand-in holding a name and an
address, and the keys etcd would hold are set as the node's thread would set them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest
import torch

from psproto.errors import Reason, error_info, reason_of
from psproto.reasons import EPOCH_KEY, PRIMARY_KEY
from psserver.core.config import ShardConfig
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard
from psserver.replication.coordinator import Coordinator, PrimaryRecord
from psserver.replication.node import NodeParts, ReplicaNode, Role
from psserver.replication.standby import HeldState
from tests.psworker.refusals import FakeRpcError

HERE = "10.0.0.1:50051"


def node_at(address: str, name: str) -> ReplicaNode:
    coordinator = SimpleNamespace(name=name, address=address, lease_valid=lambda: False)
    parts = NodeParts(
        shard=Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.1"}))),
        restore_checkpoint=lambda shard: None,
        checkpoint_clock=lambda: None,
        on_deposed=lambda why: None,
    )
    return ReplicaNode(cast(Coordinator, coordinator), parts)


def refused(node: ReplicaNode) -> FakeRpcError:
    status = node.admission("Push")
    assert status is not None
    return FakeRpcError(status)


def test_a_backup_refuses_a_push_naming_the_primary() -> None:
    node = node_at(HERE, f"{HERE}/new")
    node.role = Role.BACKUP
    node.known_primary = PrimaryRecord("10.0.0.2:50051/abcd", "10.0.0.2:50051", 4)
    error = refused(node)
    info = error_info(error)
    assert reason_of(error) is Reason.NOT_PRIMARY and info is not None
    assert dict(info.metadata) == {PRIMARY_KEY: "10.0.0.2:50051", EPOCH_KEY: "4"}
    assert "the primary is 10.0.0.2:50051 (epoch 4)" in error.details()
    assert node.view().primary == "10.0.0.2:50051"
    assert node.admission("Status") is None


def test_a_replica_restarted_at_the_dead_primarys_address_never_sends_a_worker_back_to_itself() -> None:
    # The process before this one at the same address was primary; etcd names it until its lease ends.
    node = node_at(HERE, f"{HERE}/new")
    node.role = Role.BACKUP
    node.known_primary = PrimaryRecord(f"{HERE}/old", HERE, 2)
    error = refused(node)
    info = error_info(error)
    assert reason_of(error) is Reason.NOT_PRIMARY and info is not None
    assert dict(info.metadata) == {PRIMARY_KEY: "", EPOCH_KEY: ""}  # a worker tries the other replicas
    assert "the process this one replaced at its address" in error.details()
    assert node.view().primary == ""


def test_a_primary_whose_lease_lapsed_names_no_primary() -> None:
    node = node_at(HERE, f"{HERE}/me")
    node.role = Role.PRIMARY
    node.known_primary = PrimaryRecord(f"{HERE}/me", HERE, 3)
    error = refused(node)  # the stand-in's lease is never valid
    assert "no primary yet" in error.details()
    assert node.view().primary == HERE


@pytest.mark.parametrize("held_clock", [0, 57])
def test_a_backup_shows_the_clock_of_the_state_it_holds(held_clock: int) -> None:
    node = node_at(HERE, f"{HERE}/b")
    node.role = Role.BACKUP
    if held_clock:
        state = {"params": torch.zeros(1)}
        node.standby.held = HeldState(9, held_clock, 1, "10.0.0.2:50051/abcd", state, 4)
    view = node.view()
    assert (view.clock, view.version) == ((held_clock, 9) if held_clock else (0, 0))
    assert node.parts.shard.clock == 0  # the shard itself stays empty until a promotion installs the state
