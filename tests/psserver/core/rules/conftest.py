"""Drive update rules the way the server does: a real Shard, workers that join, pull and push.

``Cluster`` wraps one in-process shard; a ``Worker`` runs the real worker procedure through
``pstools.inprocess.InProcessService`` on that shard, so a rule's ``procedure_options`` meet it.
Every model here is ``nn.Linear(2, 2)``: six parameters in two tensors (weight 0..4, bias 4..6).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2
from psserver.core.rules import PayloadKind, PushContext, RuleSpec, Telemetry, UpdateRule
from psserver.core.rules.options import RuleOptions
from psserver.core.shard import PushHeader, Shard, ShardConfig
from psserver.core.workers import PushOutcome
from pstools.inprocess import InProcessService
from psworker.binding import ModelBinding
from psworker.procedures import Procedure, build_procedure

LAYOUT = Layout.from_named_shapes([("weight", (2, 2)), ("bias", (2,))])
SEGMENTS = ((0, 4), (4, 6))
INITIAL = torch.tensor([1.0, -2.0, 0.5, 3.0, -1.0, 2.0])


def build_rule(name: str, **options: str) -> UpdateRule[RuleOptions]:
    return RuleSpec.parse(name, options).build(len(INITIAL))


def context(
    staleness: int = 0,
    *,
    worker_id: int = 1,
    kind: PayloadKind = PayloadKind.GRADIENT,
    snapshot: torch.Tensor | None = None,
    metadata: Mapping[str, float] | None = None,
) -> PushContext:
    """A push context as the shard builds it; ``snapshot`` is what the worker pulled."""
    pulled = None if snapshot is None else snapshot.clone()
    return PushContext(worker_id, staleness, kind, SEGMENTS, dict(metadata or {}), lambda: pulled)


def apply(rule: UpdateRule[RuleOptions], params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
    """Apply like the shard does: the rule may overwrite the update, so it gets a copy."""
    return rule.apply(params, update.clone(), ctx)


class Cluster:
    """One shard running ``rule``; the first worker to join initialises it with ``INITIAL``."""

    def __init__(self, rule: str, **options: str) -> None:
        self.shard = Shard(ShardConfig(RuleSpec.parse(rule, options)))
        self.layout = LAYOUT
        self._push_ids = itertools.count(1)
        self._initialised = False

    def join(self, name: str = "worker") -> int:
        worker_id = self.shard.join(name, "cpu", False, self.layout, self.layout.hash).worker.worker_id
        self._initialise(worker_id)
        return worker_id

    def _initialise(self, worker_id: int) -> None:
        if not self._initialised:
            assembler = self.shard.begin_upload(worker_id, self.layout.hash)
            for chunk in codec.encode(INITIAL):
                self.shard.decode_chunk(assembler, chunk)
            self.shard.finish_upload(assembler)
            self._initialised = True

    def service(self, name: str) -> InProcessService:
        """A worker's service on this shard (pushes in several chunks, as ``push``); initialises first."""
        service = InProcessService(self.shard, self.layout, name, chunk_bytes=8)
        self._initialise(service.worker_id)
        return service

    @property
    def params(self) -> torch.Tensor:
        return self.shard.params

    def pull(self, worker_id: int, out: torch.Tensor | None = None, reserve: bool = False) -> torch.Tensor:
        result = self.shard.pull(worker_id, ps_pb2.DTYPE_FLOAT32, exclusive=reserve)
        out = torch.empty(result.total_length) if out is None else out
        assembler = codec.Assembler(out)
        for chunk in result.chunks:
            assembler.add(chunk)
        assembler.finish()
        return out

    def pull_each(self, *worker_ids: int) -> None:
        for worker_id in worker_ids:
            self.pull(worker_id)

    def push(
        self,
        worker_id: int,
        values: torch.Tensor,
        kind: PayloadKind = PayloadKind.GRADIENT,
        metadata: Mapping[str, float] | None = None,
    ) -> PushOutcome:
        """Push computed on the worker's last pull, in several chunks as a client sends it."""
        base_clock = self.shard.workers[worker_id].pulled_clock
        return self.shard.push(
            PushHeader(worker_id, next(self._push_ids), base_clock, int(kind), self.layout.hash, dict(metadata or {})),
            codec.encode(values, chunk_bytes=8),
        )


class Worker:
    """A worker running the procedure the cluster's rule asks for, on ``nn.Linear(2, 2)``.

    ``step(gradient)`` sets the model's gradient to the given flat vector and runs one
    procedure step, so a test controls every gradient exactly.
    """

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.model = nn.Linear(2, 2)
        self.binding = ModelBinding(self.model)
        assert self.binding.layout.hash == cluster.layout.hash
        self.client = cluster.service(name)
        self.procedure: Procedure[Any] = build_procedure(self.client, self.binding)
        self.procedure.start()

    @property
    def local(self) -> torch.Tensor:
        """The worker's own parameters, flat."""
        return self.binding.gather_params().clone()

    def step(self, gradient: torch.Tensor) -> None:
        offset = 0
        for parameter in self.model.parameters():
            count = parameter.numel()
            parameter.grad = gradient[offset : offset + count].reshape(parameter.shape).clone()
            offset += count
        self.procedure.step(0.0)

    def finish(self) -> None:
        self.procedure.finish()


def segment_means(values: torch.Tensor) -> torch.Tensor:
    """Each element replaced by the mean of its model tensor."""
    out = values.clone()
    for start, end in SEGMENTS:
        out[start:end] = values[start:end].mean()
    return out
