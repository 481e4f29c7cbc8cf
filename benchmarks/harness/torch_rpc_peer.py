"""The peer: a parameter server on ``torch.distributed.rpc`` (TensorPipe over TCP), PyTorch's tutorial pattern.

    python -m benchmarks.harness.torch_rpc_peer --torch-threads 1 [--channels basic|default] [--ready-file PATH]

The server is rank 0 (``ps``) of a world of two; the benchmark process joins as rank 1
(``worker``) and calls ``rpc_sync("ps", push_and_pull, args=(key, gradient))``, which applies
``p -= lr * g`` to a flat fp32 tensor the server holds and returns the parameters. With
``--channels basic`` (the peer the targets are judged against) TensorPipe is restricted to its
``uv`` (TCP) transport and ``basic`` channel, so tensors cross loopback TCP like hetps's bytes
do. ``--channels default`` leaves TensorPipe its own choice (shared memory, cross-memory attach
where the machine allows them): a reference row only, since its bytes need not cross a socket;
its worker runs in a process of its own (``benchmarks.harness.peer_remote``), because a process
joins one rpc world only.

The server runs under the same process settings as a hetps server: its allocator settings
(``psserver.allocator.AllocatorConfig``, applied as ``psserver serve`` applies them) and the
torch thread count it is given.

The server prints ``peer rendezvous on 127.0.0.1:PORT`` before it waits for the worker, and
writes that port to ``--ready-file`` in the format of ``psserver serve --ready-file``
(``psserver/ready.py``).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import warnings
from pathlib import Path

import torch
from torch.distributed import rpc

from psserver.allocator import AllocatorConfig, apply_allocator
from psserver.ready import ReadyInfo, write_ready_file

SERVER_NAME = "ps"
WORKER_NAME = "worker"
RPC_TIMEOUT_S = 300.0
# TensorPipe's choice: "basic" is TCP only, like gRPC; "default" is whatever TensorPipe picks.
CHANNELS = ("basic", "default")

_LOCK = threading.Lock()
# Keyed by model name; held by the imported module (which is what rpc resolves functions in).
_PARAMS: dict[str, tuple[torch.Tensor, float]] = {}


def backend_options(port: int, channels: str = "basic") -> rpc.TensorPipeRpcBackendOptions:
    if channels not in CHANNELS:
        raise ValueError(f"channels {channels!r}: use one of {', '.join(CHANNELS)}")
    restrict: dict[str, list[str]] = {"_transports": ["uv"], "_channels": ["basic"]} if channels == "basic" else {}
    return rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}",
        rpc_timeout=RPC_TIMEOUT_S,
        num_worker_threads=16,
        **restrict,  # type: ignore[arg-type]
    )


def _init_rpc(name: str, rank: int, port: int, channels: str) -> None:
    options = backend_options(port, channels)
    with warnings.catch_warnings():
        # torch's own start-up uses a deprecated ProcessGroup form and warns about it.
        warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
        rpc.init_rpc(name, rank=rank, world_size=2, rpc_backend_options=options)  # type: ignore[no-untyped-call]


def loopback_environment() -> None:
    """Make TensorPipe's uv transport listen on loopback (set before ``init_rpc``)."""
    os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


# -- functions the worker runs on the server through rpc_sync (module-level, so both sides resolve them) --


def init_params(key: str, flat: torch.Tensor, lr: float) -> int:
    """Hold ``flat`` (fp32) as the parameters of ``key``, updated with ``lr``; returns their number."""
    with _LOCK:
        _PARAMS[key] = (flat.to(torch.float32).clone(), lr)
        return flat.numel()


def push_and_pull(key: str, gradient: torch.Tensor) -> torch.Tensor:
    """One worker step on the server: ``p -= lr * g``, then the parameters go back."""
    with _LOCK:
        params, lr = _PARAMS[key]
        params.sub_(gradient, alpha=lr)
        return params


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve(torch_threads: int, ready_file: Path | None = None, channels: str = "basic") -> None:
    loopback_environment()
    torch.set_num_threads(torch_threads)
    port = free_port()
    print(f"peer rendezvous on 127.0.0.1:{port}", flush=True)
    if ready_file is not None:
        write_ready_file(ready_file, ReadyInfo("127.0.0.1", port, os.getpid(), 0, 1, "torch-rpc-peer", 0, None))
    _init_rpc(SERVER_NAME, 0, port, channels)
    # Blocks until the worker calls shutdown too (the tutorial's graceful exit).
    rpc.shutdown()


def connect(port: int, channels: str = "basic") -> None:
    """Join the peer's world as the worker (once per process), with the server's ``channels``."""
    loopback_environment()
    _init_rpc(WORKER_NAME, 1, port, channels)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="torch.distributed.rpc parameter server (the benchmark's peer)")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--ready-file", type=Path, default=None, help="write the rendezvous port here (JSON)")
    parser.add_argument("--channels", choices=CHANNELS, default="basic", help="TensorPipe's transports and channels")
    args = parser.parse_args(argv)
    serve(args.torch_threads, args.ready_file, args.channels)
    sys.exit(0)


if __name__ == "__main__":
    apply_allocator(AllocatorConfig())
    main()
