"""512 workers on one real psserver with its default settings, under async, SSP and BSP.

Each worker is a coroutine of this process with a gRPC connection of its own (no shared
subchannel): it joins, then pushes and pulls in one call (PushPullUnary) for a few rounds, with a
heartbeat after each. Under BSP every push waits for its round and under SSP (bound 0) every
pull waits for the slowest worker, so hundreds of calls wait in the server at once: none may
hold a thread the others need (psserver.rpc.awaiting). Every round must close, no call fail, no
healthy worker be evicted, and every acknowledged push be applied once. The server's RSS with
one worker and with 512 says what a worker costs it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from pstools.launcher import start_server
from pstools.warm_start import stop_process
from tests.integration.probes import status

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WORKERS = 512
ROUNDS = 2
LAYOUT = Layout.from_named_shapes([("w", (64,))])
# One connection per worker, as separate worker processes would have.
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]
CALL_TIMEOUT_S = 60.0


@dataclass
class Fleet:
    """What the workers saw: acknowledged pushes, the clocks their replies carried, their failures."""

    acknowledged: int = 0
    clocks: list[list[int]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    joined: asyncio.Event = field(default_factory=asyncio.Event)
    initialized: asyncio.Event = field(default_factory=asyncio.Event)


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


async def _work(address: str, rank: int, fleet: Fleet, everyone_joined: asyncio.Barrier) -> None:
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        joined = await stub.Join(
            ps_pb2.JoinRequest(worker_name=f"w{rank}", device="cpu", layout=LAYOUT.to_proto(), layout_hash=LAYOUT.hash),
            timeout=CALL_TIMEOUT_S,
        )
        worker = joined.worker_id
        if rank == 0:
            header = ps_pb2.InitRequest(header=ps_pb2.InitHeader(worker_id=worker, layout_hash=LAYOUT.hash))
            chunks = [ps_pb2.InitRequest(chunk=c) for c in codec.encode(torch.zeros(LAYOUT.total_length))]
            await stub.Init(iter([header, *chunks]), timeout=CALL_TIMEOUT_S)
            fleet.initialized.set()
        # Nobody pushes before all have joined: a BSP round waits for every joined worker.
        await everyone_joined.wait()
        await fleet.initialized.wait()
        gradient = list(codec.encode(torch.full((LAYOUT.total_length,), 0.001)))
        clock, seen = joined.clock, []
        for push_id in range(1, ROUNDS + 1):
            request = ps_pb2.PushPullUnaryRequest(
                header=ps_pb2.PushHeader(
                    worker_id=worker,
                    push_id=push_id,
                    base_clock=clock,
                    kind=ps_pb2.PAYLOAD_KIND_GRADIENT,
                    layout_hash=LAYOUT.hash,
                ),
                chunks=gradient,
            )
            reply = await stub.PushPullUnary(request, timeout=CALL_TIMEOUT_S)
            fleet.acknowledged += 1
            # The next push is computed on the parameters this one brought back.
            clock = reply.params[0].clock
            seen.append(clock)
            await stub.Heartbeat(ps_pb2.HeartbeatRequest(worker_id=worker), timeout=CALL_TIMEOUT_S)
        fleet.clocks.append(seen)


async def _run_fleet(address: str) -> tuple[Fleet, float]:
    fleet = Fleet()
    everyone_joined = asyncio.Barrier(WORKERS)

    async def guarded(rank: int) -> None:
        try:
            await _work(address, rank, fleet, everyone_joined)
        except grpc.aio.AioRpcError as error:
            fleet.failures.append(f"w{rank}: {error.code().name} {error.details()}")
            everyone_joined.abort()

    began = time.monotonic()
    await asyncio.gather(*(guarded(rank) for rank in range(WORKERS)), return_exceptions=False)
    return fleet, time.monotonic() - began


@pytest.mark.parametrize(
    ("consistency", "flags"),
    [("async", ()), ("ssp", ("--consistency", "ssp", "--ssp-bound", "0")), ("bsp", ("--consistency", "bsp"))],
)
def test_512_workers_hold_on_default_settings(consistency: str, flags: tuple[str, ...], tmp_path: Path) -> None:
    process, address = start_server(tmp_path, "asgd", 0.1, (), extra_args=flags)
    try:
        idle_rss_kb = _rss_kb(process.pid)
        fleet, seconds = asyncio.run(_run_fleet(address))
        loaded_rss_kb = _rss_kb(process.pid)
        final = status(address)
    finally:
        assert stop_process(process) == 0
    per_worker_kb = (loaded_rss_kb - idle_rss_kb) / WORKERS
    print(
        f"\n{consistency}: {WORKERS} workers x {ROUNDS} rounds in {seconds:.1f} s; server RSS {idle_rss_kb / 1024:.0f} "
        f"-> {loaded_rss_kb / 1024:.0f} MB, {per_worker_kb:.0f} KB per worker"
    )
    assert fleet.failures == []
    assert fleet.acknowledged == WORKERS * ROUNDS
    # No healthy worker was evicted: all are still joined, and nothing was refused.
    assert len(final.workers) == WORKERS
    assert dict(final.rejected) == {}
    if consistency == "bsp":
        # One update per round, and every worker's reply carried its round's parameters.
        assert final.clock == ROUNDS
        assert all(seen == list(range(1, ROUNDS + 1)) for seen in fleet.clocks)
    else:
        # Every acknowledged push applied once.
        assert final.clock == final.applied_pushes == WORKERS * ROUNDS
    if consistency == "ssp":
        # Bound 0: a pull after a worker's k-th push waits until every worker made k.
        assert all(seen[k] >= WORKERS * (k + 1) for seen in fleet.clocks for k in range(ROUNDS))
    assert per_worker_kb < 256
