"""Who may become a shard's primary, decided from etcd's keys alone; what replication's settings refuse."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from psserver.cli import main
from psserver.replication.config import EtcdTls, ReplicationConfig
from psserver.replication.coordinator import PrimaryRecord, ShardKeys

ALIVE = {"a": "127.0.0.1:1", "b": "127.0.0.1:2"}


def test_a_new_shard_takes_the_first_replica_that_asks() -> None:
    assert ShardKeys(replicas=ALIVE).may_take_over("b")


def test_nobody_takes_over_while_a_primary_holds_the_key() -> None:
    keys = ShardKeys(primary=PrimaryRecord("a", ALIVE["a"], 3), epoch=3, in_sync=("a", "b"), replicas=ALIVE)
    assert not keys.may_take_over("b")


def test_only_an_in_sync_replica_takes_over_from_a_lost_primary() -> None:
    keys = ShardKeys(epoch=3, in_sync=("a", "b"), replicas={"b": ALIVE["b"], "c": "127.0.0.1:3"})
    assert keys.may_take_over("b")
    assert not keys.may_take_over("c")  # it may lack acknowledged pushes


def test_when_every_in_sync_replica_is_gone_any_may_start_from_the_checkpoint() -> None:
    keys = ShardKeys(epoch=3, in_sync=("a",), replicas={"c": "127.0.0.1:3"})
    assert keys.may_take_over("c")


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"etcd": ()}, "at least one etcd endpoint"),
        ({"etcd": ("127.0.0.1:2379",)}, "not http://HOST:PORT"),
        ({"etcd": ("http://etcd",)}, "not http://HOST:PORT"),
        ({"job": "a/b"}, "without '/'"),
        ({"advertise": "nohost"}, "not HOST:PORT"),
        ({"advertise": "h:70000"}, "not HOST:PORT"),
        ({"lease_seconds": 1}, "etcd's minimum lease"),
        ({"ack_timeout_seconds": 0.0}, "must be > 0"),
        ({"digest_every": 0}, "digest_every >= 1"),
        ({"etcd_tls": EtcdTls(ca=Path("ca.crt"))}, r"etcd_tls is for https:// endpoints; 'http://127.0.0.1:2379'"),
    ],
)
def test_settings_that_cannot_work_are_refused(settings: dict[str, object], problem: str) -> None:
    given: dict[str, object] = {"etcd": ("http://127.0.0.1:2379",), **settings}
    with pytest.raises(ValueError, match=problem):
        ReplicationConfig(**given)  # type: ignore[arg-type]


def test_a_certificate_for_etcd_needs_its_key() -> None:
    with pytest.raises(ValueError, match="cert and key go together"):
        EtcdTls(cert=Path("replica.crt"))


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ('ca = "{missing}"', "replication.etcd_tls.ca: cannot read {missing}"),
        ('ca = "{config}"', "replication.etcd_tls.ca: {config} is not a PEM certificate"),
        ('cert = "{config}"\nkey = "{missing}"', "replication.etcd_tls.cert: {config} is not a PEM certificate"),
    ],
)
def test_serve_exits_2_naming_an_etcd_tls_file_it_cannot_use(tmp_path: Path, table: str, problem: str) -> None:
    config, missing = tmp_path / "server.toml", tmp_path / "missing.crt"
    config.write_text("[replication.etcd_tls]\n" + table.format(missing=missing, config=config) + "\n")
    flags = ["--config", str(config), "--etcd", "https://127.0.0.1:2379/job"]
    result = CliRunner().invoke(main, ["serve", "--port", "0", "--metrics-port", "off", *flags], terminal_width=300)
    assert result.exit_code == 2, result.output
    assert problem.format(missing=missing, config=config) in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--etcd", "http://127.0.0.1:2379/a", "--etcd", "http://127.0.0.1:2380/b"], "different jobs"),
        (["--etcd", "127.0.0.1:2379"], "not http://HOST:PORT"),
    ],
)
def test_serve_exits_2_on_replication_flags_that_cannot_work(flags: list[str], problem: str) -> None:
    result = CliRunner().invoke(main, ["serve", "--port", "0", "--metrics-port", "off", *flags], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert problem in result.output


def test_serve_exits_2_on_a_metrics_port_that_is_neither_a_port_nor_off() -> None:
    for value in ("abc", "70000", "-1"):
        result = CliRunner().invoke(main, ["serve", "--port", "0", "--metrics-port", value], terminal_width=200)
        assert result.exit_code == 2, result.output
        assert "neither a port (0..65535) nor 'off'" in result.output


def test_a_replica_needs_messages_large_enough_for_the_state_it_sends(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    config.write_text("[transport]\nmax_message_bytes = 8388608\n")
    flags = ["--config", str(config), "--etcd", "http://127.0.0.1:2379/job"]
    result = CliRunner().invoke(main, ["serve", "--port", "0", "--metrics-port", "off", *flags], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "a replica takes the state in messages of 16 MiB" in result.output
