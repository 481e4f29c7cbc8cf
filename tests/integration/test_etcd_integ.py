"""The local etcd (pstools.etcd) as replicated shards use it: a client of its v3 gateway holds a
lease and a key; cut off from it by the test proxy, the client's calls fail while etcd lives, and
they work again once the proxy is restored; killed, etcd answers no one."""

from __future__ import annotations

import etcd3gw
import pytest
from etcd3gw.exceptions import ConnectionFailedError

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
