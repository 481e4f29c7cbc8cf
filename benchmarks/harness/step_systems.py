"""The systems a worker step is measured through (``benchmarks.step_round_trip``), and the servers behind each.

Every system's servers are arranged alike, so each serves the same share of a round's steps.
hetps runs one server per model for its 1-shard rows (fp32, bf16, 8-bit pushes) and a pair for
its 2-shard rows; each kind of bare mover (``bare``, ``arith``, ``overlap``) gets the same: one
server for its 1-shard rows and a pair for its 2-shard rows. A server idle between two of its
steps starts the next one colder (its threads asleep, its caches refilled by the others), and on a
small model that costs a visible share of a step; when one pair of bare movers answered all 13
mover rows, they were kept busy while each hetps server waited through the other rows' steps, which
favoured the movers. The peers are one process each, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

from torch.distributed import rpc

from benchmarks.harness import torch_rpc_peer
from benchmarks.harness.peer_remote import RemoteWorker
from benchmarks.harness.processes import Fleet, HetpsJob, ServerProcess
from benchmarks.harness.settings import TORCH_THREADS, Settings

INT8 = "1shard-int8push-bf16pull"
PEER = "peer-torch-rpc-fp32"
# The reference row: the peer on TensorPipe's default channels (no target is judged on it).
PEER_DEFAULT = "peer-torch-rpc-default-fp32"
# The bare gRPC mover as it is, doing an SGD step's arithmetic, and applying span by span.
MOVER_KINDS = ("bare", "arith", "overlap")


class HetpsVariant(NamedTuple):
    """hetps run another way: its server's flags, the kinds its rows are compared with (what the
    variant adds to each), and whether it sends a PushPull that fits one message each way as one
    PushPullUnary call (as psworker does)."""

    server_flags: tuple[str, ...]
    compared_with: tuple[str, ...]
    unary: bool = True


# On a 1-shard ASGD server of its own beside the plain one: a worker that sends every PushPull as
# two streams, also where one message each way would do (``streams``: what PushPullUnary gains;
# its ResNet-18 rows are plain hetps's, whose pushes are many chunks).
HETPS_VARIANTS = {"streams": HetpsVariant((), ("hetps",), unary=False)}
HETPS_KINDS = ("hetps", *HETPS_VARIANTS)
# Plain hetps, as a variant: no flags.
PLAIN = HetpsVariant((), ())


@dataclass(frozen=True)
class SystemSpec:
    name: str  # e.g. hetps-1shard-bf16
    # hetps, streams (HETPS_VARIANTS), bare, arith (the bare mover doing the step's
    # arithmetic), overlap (arith, its apply span by span as the reply is sent), peer, peer-default
    kind: str
    shards: int
    wire_dtype: str


def step_systems() -> list[SystemSpec]:
    specs = []
    for kind in ("hetps", "bare"):
        for shards in (1, 2):
            for dtype in ("fp32", "bf16"):
                specs.append(SystemSpec(f"{kind}-{shards}shard-{dtype}", kind, shards, dtype))
    # 8-bit pushes (error feedback on) with bf16 pulls, "PUSH/PULL"; the bare mover sends a buffer of
    # the 8-bit push's size without encoding it (the transport's cost of those bytes).
    specs.append(SystemSpec(f"hetps-{INT8}", "hetps", 1, "int8/bf16"))
    for variant in HETPS_VARIANTS:
        specs += [SystemSpec(f"{variant}-1shard-{dtype}", variant, 1, dtype) for dtype in ("fp32", "bf16")]
        specs.append(SystemSpec(f"{variant}-{INT8}", variant, 1, "int8/bf16"))
    specs.append(SystemSpec(f"bare-{INT8}", "bare", 1, "int8/bf16"))
    # The bare mover doing the arithmetic of an SGD step too (encode, decode, apply, reply conversion):
    # what hetps's single shard loses against it is its own work; what it loses against "bare", arithmetic.
    for shards in (1, 2):
        specs += [SystemSpec(f"arith-{shards}shard-{dtype}", "arith", shards, dtype) for dtype in ("fp32", "bf16")]
    specs.append(SystemSpec(f"arith-{INT8}", "arith", 1, "int8/bf16"))
    # The same, its apply made span by span as the reply is sent: what overlapping them could gain.
    specs += [SystemSpec(f"overlap-1shard-{dtype}", "overlap", 1, dtype) for dtype in ("fp32", "bf16")]
    specs.append(SystemSpec(f"overlap-{INT8}", "overlap", 1, "int8/bf16"))
    specs.append(SystemSpec(PEER, "peer", 1, "fp32"))
    specs.append(SystemSpec(PEER_DEFAULT, "peer-default", 1, "fp32"))
    return specs


def mover_groups(specs: Sequence[SystemSpec]) -> list[tuple[str, int]]:
    """(kind, shards) of every group of mover rows that shares servers, in the order of ``specs``."""
    return list(dict.fromkeys((spec.kind, spec.shards) for spec in specs if spec.kind in MOVER_KINDS))


# -- hetps's servers ---------------------------------------------------------------------------


def hetps_jobs(
    settings: Settings, two_shards: bool = True, variants: Sequence[str] = tuple(HETPS_VARIANTS)
) -> list[HetpsJob]:
    """ASGD servers for every model: one with 1 shard, two of a 2-shard layout (unless not
    ``two_shards``), and one with 1 shard for each of ``variants`` (of ``HETPS_VARIANTS``)."""
    jobs = []
    for model in settings.models:
        jobs.append(HetpsJob(f"hetps-{model}-1shard", model, "asgd", (), 0, 1))
        if two_shards:
            jobs += [HetpsJob(f"hetps-{model}-2shard-{i}", model, "asgd", (), i, 2) for i in range(2)]
        jobs += [
            HetpsJob(f"hetps-{model}-1shard-{variant}", model, "asgd", (), 0, 1, flags)
            for variant, (flags, *_) in HETPS_VARIANTS.items()
            if variant in variants
        ]
    return jobs


HetpsAddresses = dict[str, dict[tuple[str, int], list[str]]]


def hetps_addresses(settings: Settings, by_label: dict[str, ServerProcess]) -> HetpsAddresses:
    """The addresses of :func:`hetps_jobs`'s servers, by model, then kind and number of shards."""
    addresses: HetpsAddresses = {}
    for model in settings.models:
        addresses[model] = {("hetps", 1): [by_label[f"hetps-{model}-1shard"].address]}
        if f"hetps-{model}-2shard-0" in by_label:
            addresses[model][("hetps", 2)] = [by_label[f"hetps-{model}-2shard-{i}"].address for i in range(2)]
        for variant in HETPS_VARIANTS:
            if f"hetps-{model}-1shard-{variant}" in by_label:
                addresses[model][(variant, 1)] = [by_label[f"hetps-{model}-1shard-{variant}"].address]
    return addresses


# -- the systems hetps is compared with -----------------------------------------------------------


@dataclass
class Comparisons:
    """The systems hetps is compared with: the bare gRPC movers (by kind and shard count), the peer
    this process joined as its worker, and the reference peer on default channels with its worker process."""

    movers: dict[tuple[str, int], list[ServerProcess]]
    peer: ServerProcess
    peer_default: ServerProcess
    remote: RemoteWorker

    def mover_addresses(self) -> dict[tuple[str, int], list[str]]:
        return {group: [server.address for server in servers] for group, servers in self.movers.items()}

    def pids(self) -> dict[str, int]:
        """The peers' server pids under the names :func:`server_addresses` gives them."""
        return {"peer": self.peer.pid, "peer-default": self.peer_default.pid}

    def leave(self, graceful: bool = True) -> None:
        """Leave both peers' worlds (each peer server then exits)."""
        self.remote.close()
        rpc.shutdown(graceful=graceful)


def start_movers(fleet: Fleet, specs: Sequence[SystemSpec]) -> dict[tuple[str, int], list[ServerProcess]]:
    """The bare movers of every group of ``specs``, started at once; by kind and shard count."""
    labels = [f"{kind}-{shards}shard-{index}" for kind, shards in mover_groups(specs) for index in range(shards)]
    with ThreadPoolExecutor(max_workers=max(1, len(labels))) as pool:
        started = list(
            pool.map(lambda label: fleet.start_helper(label, "bare", "benchmarks.harness.bare_grpc"), labels)
        )
    movers: dict[tuple[str, int], list[ServerProcess]] = {}
    for server in started:
        kind, shards, _ = server.label.split("-")
        movers.setdefault((kind, int(shards.removesuffix("shard"))), []).append(server)
    return movers


def start_comparisons(fleet: Fleet, specs: Sequence[SystemSpec] | None = None) -> Comparisons:
    """The bare movers of every group of ``specs`` (default: :func:`step_systems`), started at once, and
    the two torch.distributed.rpc peers; this process joins the first."""
    movers = start_movers(fleet, specs or step_systems())
    peer = fleet.start_helper("peer-torch-rpc", "peer", "benchmarks.harness.torch_rpc_peer")
    default = fleet.start_helper(
        "peer-torch-rpc-default", "peer", "benchmarks.harness.torch_rpc_peer", ("--channels", "default")
    )
    remote = RemoteWorker(default.ready.port, "default", TORCH_THREADS, default.pid)
    try:
        torch_rpc_peer.connect(peer.ready.port)
    except BaseException:
        remote.close()
        raise
    return Comparisons(movers, peer, default, remote)


def server_addresses(
    spec: SystemSpec,
    model: str,
    hetps: HetpsAddresses,
    movers: dict[tuple[str, int], list[str]],
) -> list[str]:
    """The servers a system's step for ``model`` goes through (``["peer"]`` for the peer).

    hetps has servers per model, kind and shard count; each kind of bare mover has servers per shard
    count, keeping a buffer per key for every model; each peer is one process for all."""
    if spec.kind in HETPS_KINDS:
        return hetps[model][(spec.kind, spec.shards)]
    if spec.kind in MOVER_KINDS:
        return movers[(spec.kind, spec.shards)]
    return [spec.kind]
