"""TLS, mutual TLS and the bearer token: every wrong credential is refused and changes nothing."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from psproto.errors import Reason, reason_of
from psproto.layout import Layout
from psproto.security import ClientTls
from psproto.v1 import ps_pb2, ps_pb2_grpc
from pstools.launcher import start_server, stop_process
from psworker.client import NO_RETRY, ClientConfig, PSClient

pytestmark = pytest.mark.integration
LAYOUT = Layout.from_named_shapes([("w", (8,))])
TOKEN = "s3cret-token-for-tests"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path.with_suffix(".crt"), path.with_suffix(".key")


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    issuer_name, issuer_key = issuer or (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


class Pki:
    """Two CAs; CA 1 signs the server and a client, CA 2 signs an intruder's client certificate."""

    def __init__(self, root: Path) -> None:
        root.mkdir()
        keys = {name: ec.generate_private_key(ec.SECP256R1()) for name in ("ca1", "ca2", "server", "client", "other")}
        ca1 = _certificate("hetps test CA 1", keys["ca1"], None, ca=True)
        ca2 = _certificate("hetps test CA 2", keys["ca2"], None, ca=True)
        self.ca1, _ = _write(root / "ca1", ca1, keys["ca1"])
        self.ca2, _ = _write(root / "ca2", ca2, keys["ca2"])
        signer1 = (ca1.subject, keys["ca1"])
        signer2 = (ca2.subject, keys["ca2"])
        server = _certificate("server", keys["server"], signer1, server=True)
        self.server = _write(root / "server", server, keys["server"])
        self.client = _write(root / "client", _certificate("worker", keys["client"], signer1), keys["client"])
        self.other = _write(root / "other", _certificate("intruder", keys["other"], signer2), keys["other"])
        self.token = root / "token"
        self.token.write_text(TOKEN + "\n")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Pki]]:
    root = tmp_path_factory.mktemp("security")
    pki = Pki(root / "pki")
    args = [
        "--tls-cert",
        str(pki.server[0]),
        "--tls-key",
        str(pki.server[1]),
        "--tls-client-ca",
        str(pki.ca1),
        "--auth-token-file",
        str(pki.token),
    ]
    process, address = start_server(root, "asgd", 0.1, (), extra_args=args)
    yield address, pki
    assert stop_process(process) == 0


def _channel(address: str, pki: Pki, ca: Path | None = None, pair: tuple[Path, Path] | None = None) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(ca or pki.ca1).read_bytes(),
        private_key=pair[1].read_bytes() if pair else None,
        certificate_chain=pair[0].read_bytes() if pair else None,
    )
    return grpc.secure_channel(address, credentials)


def _join(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...]) -> ps_pb2.JoinResponse:
    request = ps_pb2.JoinRequest(worker_name="w", layout=LAYOUT.to_proto(), layout_hash=LAYOUT.hash)
    reply: ps_pb2.JoinResponse = ps_pb2_grpc.ParameterServerStub(channel).Join(request, timeout=10, metadata=metadata)
    return reply


def _status(address: str, pki: Pki) -> ps_pb2.StatusResponse:
    with _channel(address, pki, pair=pki.client) as channel:
        reply: ps_pb2.StatusResponse = ps_pb2_grpc.ParameterServerStub(channel).Status(
            ps_pb2.StatusRequest(), timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),)
        )
        return reply


def test_wrong_credentials_are_refused_and_change_nothing(secured: tuple[str, Pki]) -> None:
    address, pki = secured
    before = _status(address, pki)
    good = (("authorization", f"Bearer {TOKEN}"),)
    refusals: list[tuple[str, grpc.StatusCode, Reason | None]] = []
    cases: list[tuple[str, grpc.Channel, tuple[tuple[str, str], ...]]] = [
        ("no token", _channel(address, pki, pair=pki.client), ()),
        ("wrong token", _channel(address, pki, pair=pki.client), (("authorization", "Bearer guess"),)),
        ("not a bearer token", _channel(address, pki, pair=pki.client), (("authorization", TOKEN),)),
        ("plaintext", grpc.insecure_channel(address), good),
        ("no client certificate", _channel(address, pki), good),
        ("client certificate of another CA", _channel(address, pki, pair=pki.other), good),
        ("server not trusted (other CA)", _channel(address, pki, ca=pki.ca2, pair=pki.client), good),
    ]
    for label, channel, metadata in cases:
        with channel, pytest.raises(grpc.RpcError) as refused:
            _join(channel, metadata)
        refusals.append((label, refused.value.code(), reason_of(refused.value)))
    unauthenticated = (grpc.StatusCode.UNAUTHENTICATED, Reason.UNAUTHENTICATED)
    assert refusals[:3] == [(label, *unauthenticated) for label, _, _ in cases[:3]]
    # Handshake failures: the connection never carries an RPC, so no server gave a reason.
    assert all(code == grpc.StatusCode.UNAVAILABLE and reason is None for _, code, reason in refusals[3:]), refusals
    after = _status(address, pki)
    assert (after.clock, len(after.workers), after.initialized) == (before.clock, 0, before.initialized)
    assert after.rejected["unauthenticated"] - before.rejected["unauthenticated"] == 3


def test_the_right_credentials_train_and_health_needs_no_token(secured: tuple[str, Pki]) -> None:
    address, pki = secured
    with _channel(address, pki, pair=pki.client) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    tls = ClientTls(pki.ca1, *pki.client)
    with PSClient(
        address, LAYOUT, name="trusted", config=ClientConfig(tls=tls, auth_token=TOKEN, retry=NO_RETRY)
    ) as client:
        client.init(torch.zeros(8))
        client.push(torch.ones(8))
        out = torch.empty(8)
        client.pull(out)
        assert torch.allclose(out, torch.full((8,), -0.1))
    with _channel(address, pki, pair=pki.client) as channel, pytest.raises(grpc.RpcError) as refused:
        ps_pb2_grpc.ParameterServerStub(channel).Checkpoint(
            ps_pb2.CheckpointRequest(), timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),)
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "--checkpoint-dir" in (refused.value.details() or "")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=60)


def test_bad_security_flags_exit_2_with_what_to_fix(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    cert, key = pki.server
    # A client certificate without the CA that signed the server: the worker's file names the key.
    worker_cert_only = tmp_path / "worker.toml"
    worker_cert_only.write_text(f"[train.client.tls]\ncert = '{cert}'\nkey = '{key}'\n")
    cases = [
        (("psserver", "serve", "--port", "0", "--no-metrics", "--tls-cert", str(cert)), "--tls-key"),
        (("psserver", "serve", "--port", "0", "--no-metrics", "--tls-client-ca", str(pki.ca1)), "--tls-cert"),
        (("psserver", "serve", "--port", "0", "--no-metrics", "--auth-token-file", str(empty)), "is empty"),
        (("psserver", "serve", "--port", "0", "--no-metrics", "--tls-cert", str(key), "--tls-key", str(key)), "PEM"),
        (("psworker", "train", "--server", "127.0.0.1:1", "--config", str(worker_cert_only)), "train.client.tls.ca"),
    ]
    for args, hint in cases:
        result = _cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert hint in result.stderr, (args, result.stderr)
