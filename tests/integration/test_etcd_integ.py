"""The local etcd (pstools.etcd) as replicated shards use it: a client of its v3 gateway holds a
lease and a key; cut off from it by the test proxy, the client's calls fail while etcd lives, and
they work again once the proxy is restored; killed, etcd answers no one. A replica's watch of its
shard's keys hears of each change, and of its own end."""

from __future__ import annotations

import threading
import time

import etcd3gw
import pytest
from etcd3gw.exceptions import ConnectionFailedError

from psserver.replication.config import ReplicationConfig
from psserver.replication.coordinator import Coordinator
from pstools.etcd import LocalEtcd
from tests.integration.tcp_proxy import TcpProxy


def _client(port: int) -> etcd3gw.Etcd3Client:
    return etcd3gw.client(host="127.0.0.1", port=port, timeout=2.0)


def test_local_etcd_serves_leases_and_a_proxy_cuts_a_client_off(etcd: LocalEtcd) -> None:
    port = int(etcd.url.rsplit(":", 1)[1])
    direct = _client(port)
    lease = direct.lease(2)
    assert direct.put("/hetps/test/key", "primary", lease=lease)
    assert direct.get("/hetps/test/key") == [b"primary"]

    with TcpProxy(("127.0.0.1", port)) as proxy:
        behind = _client(proxy.port)
        assert behind.get("/hetps/test/key") == [b"primary"]
        proxy.cut()
        with pytest.raises(ConnectionFailedError):
            behind.lease(2)
        # Only the client behind the proxy is cut off: etcd and everyone else carry on.
        assert lease.refresh() == 2
        proxy.restore()
        assert behind.get("/hetps/test/key") == [b"primary"]

    etcd.kill()
    assert etcd.process.returncode == -9
    with pytest.raises(ConnectionFailedError):
        direct.get("/hetps/test/key")


def _coordinator(url: str, name: str, shard: int = 0) -> Coordinator:
    return Coordinator(ReplicationConfig(etcd=(url,), job="watched"), shard, name, f"127.0.0.1:{len(name)}")


def test_a_replica_hears_of_each_change_of_its_shards_keys_and_of_its_watch_ending(etcd: LocalEtcd) -> None:
    port = int(etcd.url.rsplit(":", 1)[1])
    with TcpProxy(("127.0.0.1", port)) as proxy:
        watching = _coordinator(f"http://127.0.0.1:{proxy.port}", "watcher")
        changed = threading.Event()
        watch = watching.watch(changed)
        assert changed.wait(5)  # the watch's creation: the keys are read once it is in place
        changed.clear()
        _coordinator(etcd.url, "other-shard", shard=1).grant()  # another shard's keys: not this one's business
        assert not changed.wait(0.5)
        _coordinator(etcd.url, "newcomer").grant()  # a replica of this shard registers
        assert changed.wait(5) and watch.alive
        changed.clear()
        proxy.cut()  # etcd unreachable: the watch ends, and says so
        assert changed.wait(5)
        deadline = time.monotonic() + 5
        while watch.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not watch.alive
        watch.close()
