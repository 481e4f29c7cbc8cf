"""Replicas of a shard that are not its primary, as a worker meets them: a backup, a real gRPC server
on a free loopback port that refuses every ParameterServer call with NOT_PRIMARY naming the primary
(``psserver.rpc.status_codes.refusal``, the server's own refusal) and counts what it refused; and a
replica that is down, a closed port."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc

from psproto.reasons import EPOCH_KEY, PRIMARY_KEY, Reason
from psserver.rpc.status_codes import refusal
from pstools.etcd import free_ports

_SERVICE = "/psproto.v1.ParameterServer/"


@dataclass
class NotPrimary:
    """The running backup: its address and the calls it refused, by method."""

    address: str
    refused: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Refuser(grpc.GenericRpcHandler):
    def __init__(self, backup: NotPrimary, primary: str) -> None:
        self._backup = backup
        self._status = refusal(
            Reason.NOT_PRIMARY,
            f"this replica is a backup; the primary is {primary or 'being elected'}",
            {PRIMARY_KEY: primary, EPOCH_KEY: "1" if primary else ""},
        )

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        if not method.startswith(_SERVICE):
            return None

        def refuse(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            # Any call form (unary or streaming) is a stream of bytes to a handler of this kind.
            with self._backup.lock:
                self._backup.refused[method.removeprefix(_SERVICE)] += 1
            context.abort_with_status(self._status)
            yield b""  # never reached: abort raises

        return grpc.stream_stream_rpc_method_handler(refuse)


@contextmanager
def not_primary_server(primary: str) -> Iterator[NotPrimary]:
    """A backup naming ``primary`` (empty: an election is running) while the block runs."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    port = server.add_insecure_port("127.0.0.1:0")
    backup = NotPrimary(f"127.0.0.1:{port}")
    server.add_generic_rpc_handlers((_Refuser(backup, primary),))
    server.start()
    try:
        yield backup
    finally:
        server.stop(0)


def closed_port() -> str:
    """A loopback address nothing listens on (a replica that is down): a connection there is refused
    at once. Taken below the kernel's range for port-0 binds, so no server a test starts after it
    (a stand-in backup on port 0) can be given the same port."""
    return f"127.0.0.1:{free_ports(1)[0]}"
