"""The systems a worker step (push a gradient, get the parameters back) goes through, behind one interface.

hetps (``PSClient``), the bare gRPC byte mover (the transport's ceiling) and the
torch.distributed.rpc peer each implement :class:`StepSystem`, so a measurement times them
alike and interleaves them step by step. ``client_pids`` names the processes besides the
benchmark's own that do a step's client work (the reference peer's worker,
``benchmarks.harness.peer_remote``), so their CPU is counted as the client's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch
from torch.distributed import rpc

from benchmarks.harness import bare_grpc, torch_rpc_peer
from benchmarks.harness.models import MODELS
from benchmarks.harness.settings import LR
from psproto import codec
from psproto.layout import Layout
from psworker.client import ClientConfig, PSClient
from psworker.push_encoding import wire_dtypes


class StepSystem(Protocol):
    client_pids: tuple[int, ...]

    def step(self, update: torch.Tensor, out: torch.Tensor) -> None: ...

    def close(self) -> None: ...


def hetps_client(
    addresses: list[str],
    layout: Layout,
    name: str,
    wire: str,
    chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES,
) -> PSClient:
    """A worker's client whose ``wire`` is a dtype for both ways or ``PUSH/PULL`` ("int8/bf16": 8-bit
    pushes, bf16 pulls); a ValueError names a dtype that does not exist (:func:`wire_problem`)."""
    push, _, pull = wire.partition("/")
    return PSClient(
        addresses,
        layout,
        name=name,
        config=ClientConfig(wire_dtype=pull or push, push_dtype=push, chunk_bytes=chunk_bytes),
    )


def wire_problem(wire: str) -> str | None:
    """What is wrong with a ``--wire`` value such as ``fp32`` or ``int8/bf16``, or None."""
    push, _, pull = wire.partition("/")
    try:
        wire_dtypes(pull or push, push, None)
    except ValueError as error:
        return str(error)
    return None


class HetpsStep:
    client_pids: tuple[int, ...] = ()

    def __init__(
        self,
        addresses: list[str],
        layout: Layout,
        name: str,
        wire_dtype: str,
        flat: torch.Tensor,
        chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES,
        unary: bool = True,
    ) -> None:
        """``unary``: False sends every PushPull as streams, also where psworker would make it one call."""
        self.client = hetps_client(addresses, layout, name, wire_dtype, chunk_bytes)
        if not unary:
            self.client.unary_push_pulls = [False] * len(self.client.sessions)
        if not self.client.initialized:
            self.client.init(flat)
        self.client.pull(torch.empty_like(flat))

    def step(self, update: torch.Tensor, out: torch.Tensor) -> None:
        self.client.push(update, pull_into=out)

    def close(self) -> None:
        self.client.close()


class BareStep:
    client_pids: tuple[int, ...] = ()

    def __init__(
        self,
        addresses: list[str],
        layout: Layout,
        key: str,
        wire_dtype: str,
        flat: torch.Tensor,
        chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES,
        *,
        arithmetic: bool = False,
        apply_by_span: bool = False,
    ) -> None:
        self.client = bare_grpc.BareClient(addresses, layout, key, wire_dtype, chunk_bytes, arithmetic, apply_by_span)
        self.client.init(flat)

    def step(self, update: torch.Tensor, out: torch.Tensor) -> None:
        self.client.step(update, out)

    def close(self) -> None:
        self.client.close()


class PeerStep:
    client_pids: tuple[int, ...] = ()

    def __init__(self, key: str, flat: torch.Tensor) -> None:
        self.key = key
        rpc.rpc_sync(torch_rpc_peer.SERVER_NAME, torch_rpc_peer.init_params, args=(key, flat, LR))

    def step(self, update: torch.Tensor, out: torch.Tensor) -> None:
        params = rpc.rpc_sync(torch_rpc_peer.SERVER_NAME, torch_rpc_peer.push_and_pull, args=(self.key, update))
        out.copy_(params)  # into the worker's buffer, as hetps does

    def close(self) -> None:
        pass


# Warm-up ends once the system's processes held their memory this many steps running...
STABLE_STEPS = 5
# ...growing by less than this over each of them (MB of VmRSS, all the processes together)...
STABLE_GROWTH_MB = 4.0
# ...or after this many steps in all.
WARMUP_CAP = 60


def warm_up(
    system: StepSystem, update: torch.Tensor, out: torch.Tensor, minimum: int, rss_mb: Callable[[], float]
) -> int:
    """Step ``system`` until it is warm; the number of steps taken.

    Every system gets the same rule: at least ``minimum`` steps, then on until ``rss_mb`` (the
    resident memory of its server processes and any client process of its own) grew by less
    than ``STABLE_GROWTH_MB`` on each of ``STABLE_STEPS`` steps running, at most ``WARMUP_CAP``
    steps. hetps and the bare mover reuse their buffers and are warm in a few steps; the
    TensorPipe peer grew by one ResNet-18-sized buffer (47 MB) a step for its first ~25 steps,
    to 1.27 GB, and its steps took up to twice as long (more server CPU, faulting pages in)
    until it stopped growing."""
    steps = stable = 0
    before = rss_mb()
    while steps < WARMUP_CAP and (steps < minimum or stable < STABLE_STEPS):
        system.step(update, out)
        steps += 1
        after = rss_mb()
        stable = stable + 1 if after - before < STABLE_GROWTH_MB else 0
        before = after
    return steps


def time_steps(system: StepSystem, update: torch.Tensor, out: torch.Tensor, count: int) -> list[float]:
    """Seconds each of ``count`` steps took."""
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        system.step(update, out)
        samples.append(time.perf_counter() - started)
    return samples


def seeded_parameters(length: int) -> torch.Tensor:
    """The parameters every benchmark starts a model from (seed 0, scaled to 0.01)."""
    return torch.randn(length, generator=torch.Generator().manual_seed(0)) * 0.01


def initialize_parameters(model: str, addresses: list[str]) -> None:
    """Init the servers at ``addresses`` with ``model``'s parameters (seed 0) unless already done."""
    layout = Layout.from_named_shapes(MODELS[model](), len(addresses))
    client = PSClient(addresses, layout, name="bench-init")
    try:
        if not client.initialized:
            client.init(seeded_parameters(layout.total_length))
    finally:
        client.close()
