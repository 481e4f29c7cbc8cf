"""The systems a worker step (push a gradient, get the parameters back) goes through, behind one interface.

hetps (``PSClient``), the bare gRPC byte mover (the transport's ceiling) and the
torch.distributed.rpc peer each implement :class:`StepSystem`, so a measurement times them
alike and interleaves them step by step.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch
from torch.distributed import rpc

from benchmarks.harness import bare_grpc, torch_rpc_peer
from benchmarks.harness.models import MODELS
from benchmarks.harness.settings import LR
from psproto import codec
from psproto.layout import Layout
from psworker.client import PSClient


class StepSystem(Protocol):
    def step(self, update: torch.Tensor, out: torch.Tensor) -> None: ...

    def close(self) -> None: ...


class HetpsStep:
    def __init__(self, addresses: list[str], layout: Layout, name: str, wire_dtype: str, flat: torch.Tensor) -> None:
        push, _, pull = wire_dtype.partition("/")  # "int8/bf16": 8-bit pushes, bf16 pulls
        self.client = PSClient(addresses, layout, name=name, wire_dtype=pull or push, push_dtype=push)
        if not self.client.initialized:
            self.client.init(flat)
        self.client.pull(torch.empty_like(flat))

    def step(self, update: torch.Tensor, out: torch.Tensor) -> None:
        self.client.push(update, pull_into=out)

    def close(self) -> None:
        self.client.close()


class BareStep:
    def __init__(self, addresses: list[str], layout: Layout, key: str, wire_dtype: str, flat: torch.Tensor) -> None:
        self.client = bare_grpc.BareClient(addresses, layout, key, wire_dtype, codec.DEFAULT_CHUNK_BYTES)
        self.client.init(flat)

    def step(self, update: torch.Tensor, out: torch.Tensor) -> None:
        self.client.step(update, out)

    def close(self) -> None:
        self.client.close()


class PeerStep:
    def __init__(self, key: str, flat: torch.Tensor) -> None:
        self.key = key
        rpc.rpc_sync(torch_rpc_peer.SERVER_NAME, torch_rpc_peer.init_params, args=(key, flat, LR))

    def step(self, update: torch.Tensor, out: torch.Tensor) -> None:
        params = rpc.rpc_sync(torch_rpc_peer.SERVER_NAME, torch_rpc_peer.push_and_pull, args=(self.key, update))
        out.copy_(params)  # into the worker's buffer, as hetps does

    def close(self) -> None:
        pass


def time_steps(system: StepSystem, update: torch.Tensor, out: torch.Tensor, count: int) -> list[float]:
    """Seconds each of ``count`` steps took."""
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        system.step(update, out)
        samples.append(time.perf_counter() - started)
    return samples


def initialize_parameters(model: str, addresses: list[str]) -> None:
    """Init the servers at ``addresses`` with ``model``'s parameters (seed 0) unless already done."""
    layout = Layout.from_named_shapes(MODELS[model](), len(addresses))
    client = PSClient(addresses, layout, name="bench-init")
    try:
        if not client.initialized:
            client.init(torch.randn(layout.total_length, generator=torch.Generator().manual_seed(0)) * 0.01)
    finally:
        client.close()
