"""Replicated shards under mutual TLS and a bearer token, with real processes: two ``psserver serve
--etcd`` replicas given the same certificate, CA and token files send each other the shard's state
over TLS, a worker holding the CA, its own certificate and the token pushes through the primary,
the primary is killed (SIGKILL), the backup takes over with every acknowledged push, and the killed
replica, started again, takes the state from its successor over TLS. A replica that trusts another
CA never takes the state, and the primary says why. etcd too serves TLS and asks for client
certificates; a replica that does not trust etcd's CA exits, saying what to set."""

from __future__ import annotations

import re
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pscli.config_file import dump_toml
from psproto.layout import Layout
from psproto.security import ClientTls
from psserver.replication.config import EtcdTls, ReplicationConfig
from psserver.replication.coordinator import Coordinator
from psserver.rpc.security import ServerTls
from pstools.etcd import LocalEtcd
from pstools.warm_start import start_program
from psworker.client import ClientConfig, PSClient
from tests.integration.probes import wait_for
from tests.integration.replica_sets import ReplicaSet, replica_set
from tests.pki import TOKEN, Pki

pytestmark = pytest.mark.integration

LAYOUT = Layout.from_named_shapes([("w", (8,))])
LR = 0.05  # replica_sets' servers: ASGD at this rate
PUSHES = 20


def _etcd_tls(pki: Pki, ca: Path) -> dict[str, dict[str, dict[str, str]]]:
    """The ``[replication.etcd_tls]`` of a replica trusting ``ca``, presenting the server's pair."""
    cert, key = pki.server
    return {"replication": {"etcd_tls": {"ca": str(ca), "cert": str(cert), "key": str(key)}}}


@pytest.fixture
def secured_etcd(tmp_path: Path) -> Iterator[tuple[LocalEtcd, Pki]]:
    """An etcd that serves https:// and asks for client certificates of CA 1, as a production one is
    set up; and the certificates."""
    if shutil.which("etcd") is None:
        pytest.skip("Debian's etcd is not installed; make test installs it (apt-get install etcd-server)")
    pki = Pki(tmp_path / "pki")
    with LocalEtcd(tmp_path / "etcd", tls=ServerTls(*pki.server, pki.ca1)) as etcd:
        yield etcd, pki


@pytest.fixture
def secured_replicas(tmp_path: Path, secured_etcd: tuple[LocalEtcd, Pki]) -> Iterator[tuple[ReplicaSet, Pki]]:
    etcd, pki = secured_etcd
    flags, table = pki.server_flags(), _etcd_tls(pki, pki.ca1)
    for replicas in replica_set(tmp_path, etcd, count=2, server_args=flags, probe=pki.status, server_table=table):
        yield replicas, pki


def push_ones(client: PSClient, times: int) -> None:
    params = torch.empty(LAYOUT.total_length)
    for _ in range(times):
        client.pull(params)
        client.push(torch.ones(LAYOUT.total_length))


def test_replicas_under_mutual_tls_and_a_token_replicate_and_fail_over(
    secured_replicas: tuple[ReplicaSet, Pki],
) -> None:
    replicas, pki = secured_replicas
    first = replicas.in_sync(1)  # the backup took the state from the primary over TLS
    config = ClientConfig(tls=ClientTls(pki.ca1, *pki.client), auth_token=TOKEN)
    with PSClient(replicas.servers, LAYOUT, name="w", config=config) as client:
        client.init(torch.zeros(LAYOUT.total_length))
        push_ones(client, PUSHES)
        process = replicas.processes[first]
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait()
        successor = replicas.primary()
        assert successor != first
        push_ones(client, PUSHES)  # the worker follows the replica set to the new primary
        replicas.start(first)
        assert replicas.in_sync(1) == successor  # the restarted replica caught up over TLS
        params = torch.empty(LAYOUT.total_length)
        client.pull(params)
    final = replicas.probe(replicas.addresses[successor])
    # Nothing acknowledged was lost or applied twice: ASGD applied each push of ones once.
    assert final.applied_pushes == final.clock == 2 * PUSHES
    assert torch.allclose(params, torch.full_like(params, -LR * 2 * PUSHES))
    assert final.replica.epoch == 2 and final.replica.role == "primary"
    # Both replicas hold the same version once the primary is idle (the worker's Leave, which is not
    # waited for, may still be on its way to the backup).
    wait_for(
        lambda: len({replicas.probe(address).replica.version for address in replicas.addresses}) == 1,
        10,
        "the backup at its primary's version",
    )

    # Started again trusting another CA, the replica refuses its primary's certificate: it never
    # takes the state, and the primary's log says which backup and why.
    process = replicas.processes[first]
    assert process is not None
    process.kill()
    process.wait()
    replicas.server_args = pki.server_flags(pki.ca2)
    replicas.start(first)
    started = re.search(r"replica (\S+) of shard 0", replicas.logs[first].read_text())
    assert started is not None
    name = started.group(1)
    warning = f"backup {name} at {replicas.addresses[first]} cannot take the state: UNAVAILABLE"
    log = replicas.logs[successor]
    wait_for(lambda: warning in log.read_text(), 30, "the primary's warning")
    assert "each replica must trust the CA" in log.read_text()
    backups = {b.name: b for b in replicas.probe(replicas.addresses[successor]).replica.backups}
    assert not backups[name].in_sync, backups


def test_a_replica_that_does_not_trust_etcds_ca_exits_saying_what_to_set(
    secured_etcd: tuple[LocalEtcd, Pki], tmp_path: Path
) -> None:
    etcd, pki = secured_etcd
    config = tmp_path / "wrong-ca.toml"
    config.write_text(dump_toml(_etcd_tls(pki, pki.ca2)))
    command = ["serve", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "off", "--config", str(config)]
    log = tmp_path / "wrong-ca.log"
    process = start_program("psserver", [*command, "--etcd", etcd.url + "/test"], log)
    said = " ".join(log.read_text().split()) if process.wait(60) == 1 else f"exit {process.wait()}"
    assert f"cannot reach etcd at {etcd.url}" in said and "CERTIFICATE_VERIFY_FAILED" in said, said
    assert "replication.etcd_tls.ca must be the CA that signed etcd's certificate" in said, said


def test_a_replica_watches_its_keys_on_an_etcd_that_serves_tls(secured_etcd: tuple[LocalEtcd, Pki]) -> None:
    etcd, pki = secured_etcd
    cert, key = pki.server
    config = ReplicationConfig(etcd=(etcd.url,), job="watched", etcd_tls=EtcdTls(ca=pki.ca1, cert=cert, key=key))
    changed = threading.Event()
    watch = Coordinator(config, 0, "watcher", "127.0.0.1:1").watch(changed)
    assert changed.wait(5)  # created
    changed.clear()
    Coordinator(config, 0, "newcomer", "127.0.0.1:2").grant()
    assert changed.wait(5) and watch.alive
    watch.close()
    assert not watch.alive
