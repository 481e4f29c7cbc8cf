"""Certificates for the TLS tests: two CAs, a server, a worker and an intruder, made in-process."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

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
