"""gRPC health check for a psserver shard: exit 0 when it answers SERVING, 1 otherwise.

The image's HEALTHCHECK and the Kubernetes exec probes (where the native gRPC probe cannot
be used, e.g. with TLS) run it. It calls the standard ``grpc.health.v1.Health/Check``,
which every psserver serves and which needs no bearer token.

    python /opt/hetps/healthcheck.py                       # 127.0.0.1:50051, whole server
    python /opt/hetps/healthcheck.py --address host:50052 --service psproto.v1.ParameterServer
    python /opt/hetps/healthcheck.py --tls-ca ca.crt [--tls-cert tls.crt --tls-key tls.key]

Defaults come from the environment too: HETPS_HEALTH_ADDRESS, HETPS_HEALTH_TLS_CA,
HETPS_HEALTH_TLS_CERT, HETPS_HEALTH_TLS_KEY, HETPS_HEALTH_TLS_SERVER_NAME.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def check(
    address: str,
    service: str = "",
    timeout_s: float = 3.0,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_server_name: str | None = None,
) -> str:
    """The serving status name (``SERVING``, ``NOT_SERVING``, ...) of ``service`` at ``address``."""
    if tls_ca or tls_cert:
        credentials = grpc.ssl_channel_credentials(_read(tls_ca), _read(tls_key), _read(tls_cert))
        options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
        channel = grpc.secure_channel(address, credentials, options=options)
    else:
        channel = grpc.insecure_channel(address)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def main(argv: list[str] | None = None) -> int:
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=env("HETPS_HEALTH_ADDRESS", "127.0.0.1:50051"), help="HOST:PORT")
    parser.add_argument("--service", default="", help="service name; empty means the whole server")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds")
    parser.add_argument("--tls-ca", default=env("HETPS_HEALTH_TLS_CA"), help="CA bundle: connect with TLS")
    parser.add_argument("--tls-cert", default=env("HETPS_HEALTH_TLS_CERT"), help="client certificate (mTLS)")
    parser.add_argument("--tls-key", default=env("HETPS_HEALTH_TLS_KEY"), help="client key (mTLS)")
    parser.add_argument(
        "--tls-server-name", default=env("HETPS_HEALTH_TLS_SERVER_NAME"), help="name the certificate is for"
    )
    args = parser.parse_args(argv)
    try:
        status = check(
            args.address, args.service, args.timeout, args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name
        )
    except grpc.RpcError as error:
        print(f"{args.address}: {error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"{args.address}: {error}", file=sys.stderr)
        return 1
    print(f"{args.address}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
