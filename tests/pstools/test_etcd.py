"""Starting the local etcd without its binary: an error that names the package to install."""

from __future__ import annotations

from pathlib import Path

import pytest

from pstools.etcd import ETCD_PACKAGE, EtcdError, LocalEtcd


def test_missing_etcd_names_the_debian_package(tmp_path: Path) -> None:
    with pytest.raises(EtcdError, match=rf"apt-get install {ETCD_PACKAGE}\b") as raised:
        LocalEtcd(tmp_path / "etcd", binary=str(tmp_path / "no-such-etcd"))
    assert "no-such-etcd" in str(raised.value)
    assert not (tmp_path / "etcd").exists()
