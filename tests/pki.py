"""Certificates for the TLS tests: two CAs, a server, a worker and an intruder, made in-process; and
the channel and Status call a test makes with them."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from psproto.v1 import ps_pb2, ps_pb2_grpc

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

    def server_flags(self, client_ca: Path | None = None) -> list[str]:
        """``psserver serve`` flags: the server's certificate, client certificates of ``client_ca``
        (CA 1 by default) required, and the token."""
        cert, key = self.server
        flags = ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(client_ca or self.ca1)]
        return [*flags, "--auth-token-file", str(self.token)]

    def channel(self, address: str, ca: Path | None = None, pair: tuple[Path, Path] | None = None) -> grpc.Channel:
        """A TLS channel trusting ``ca`` (CA 1 by default), presenting ``pair`` (cert, key) when given."""
        credentials = grpc.ssl_channel_credentials(
            root_certificates=(ca or self.ca1).read_bytes(),
            private_key=pair[1].read_bytes() if pair else None,
            certificate_chain=pair[0].read_bytes() if pair else None,
        )
        return grpc.secure_channel(address, credentials)

    def status(self, address: str) -> ps_pb2.StatusResponse:
        """The server's Status as the trusted worker: its certificate and the token."""
        with self.channel(address, pair=self.client) as channel:
            reply: ps_pb2.StatusResponse = ps_pb2_grpc.ParameterServerStub(channel).Status(
                ps_pb2.StatusRequest(), timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),)
            )
            return reply
