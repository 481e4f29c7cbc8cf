"""Worker procedures: what a worker does each step for the rule the server runs.

The server names the procedure in its Join reply (``RuleInfo.worker_procedure``) with its
options; a worker runs exactly that one. Every procedure keeps the model's parameters in
step with what it last pulled or computed, and pushes through the client's flat buffers.

- ``gradient``: push the raw gradient of every step (ASGD, SA, momentum, GA, AB, OrMo...).
- ``delta``: windowed DOWNPOUR/DynSGD: ``λ`` local SGD steps, push ``θ_end − θ_start``.
- ``diloco``: DiLoCo/Delayed Nesterov: ``H`` steps of the task's own optimizer, push ``θ_end − θ_start``.
- ``agn``: like ``delta`` with any local optimizer, the window's delta divided by the steps done.
- ``easgd``: asynchronous EASGD/EAMSGD: every ``λ`` local steps push the elastic difference.
- ``gem``: Gradient Energy Matching: push ``π ⊙ Δ`` with ``π`` matching the proxy's momentum energy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import nn

from psproto.v1 import ps_pb2
from psworker.binding import ModelBinding
from psworker.procedure_options import (
    AgnOptions,
    DeltaOptions,
    DilocoOptions,
    EasgdOptions,
    GemOptions,
    GradientOptions,
    ProcedureError,
    parse_options,
)
from psworker.service import ParameterService, PushResult
from psworker.task import OptimizerFactory

__all__ = [
    "PROCEDURES",
    "AgnProcedure",
    "DilocoProcedure",
    "EasgdProcedure",
    "GemProcedure",
    "GradientProcedure",
    "Procedure",
    "ProcedureError",
    "StepOutcome",
    "WindowedDeltaProcedure",
    "assigned_window",
    "build_procedure",
    "procedure_class",
]

OptionsT = TypeVar("OptionsT")


@dataclass
class StepOutcome:
    loss: float
    pushed: bool
    staleness: int = 0
    telemetry: dict[str, float] = field(default_factory=dict)


@dataclass
class StepCounts:
    """What a worker's steps did: how many, how many pushed, and the staleness of those pushes."""

    steps: int = 0
    pushes: int = 0
    staleness_sum: int = 0
    max_staleness: int = 0

    def count(self, outcome: StepOutcome) -> None:
        self.steps += 1
        if outcome.pushed:
            self.pushes += 1
            self.staleness_sum += outcome.staleness
            self.max_staleness = max(self.max_staleness, outcome.staleness)

    @property
    def mean_staleness(self) -> float:
        return self.staleness_sum / self.pushes if self.pushes else 0.0


def assigned_window(results: list[PushResult]) -> int | None:
    """The local steps the shards assign to the next window, None when none does. Shards time
    the same pushes and agree but for jitter; the fewest keeps a slow worker from holding anyone up."""
    assigned = [r.local_steps for r in results if r.local_steps > 0]
    return min(assigned) if assigned else None


def _summarise(results: list[PushResult]) -> tuple[int, dict[str, float]]:
    staleness = max(r.staleness for r in results)
    telemetry: dict[str, float] = {}
    for result in results:
        for key, value in result.telemetry.items():
            telemetry[key] = telemetry.get(key, 0.0) + value / len(results)
    return staleness, telemetry


class Procedure(ABC, Generic[OptionsT]):
    """One worker procedure; ``options`` are the server's, parsed into ``options_type``.

    ``build_optimizer`` is the task's own optimizer factory; only procedures whose local steps
    run the task's optimizer (``diloco``) use it."""

    name: ClassVar[str]
    options_type: ClassVar[type[Any]]

    def __init__(
        self,
        client: ParameterService,
        binding: ModelBinding,
        options: OptionsT,
        build_optimizer: OptimizerFactory | None = None,
    ) -> None:
        self.client = client
        self.binding = binding
        self.options = options
        self.build_optimizer = build_optimizer

    def start(self) -> None:
        """Take the server's current parameters as the model's."""
        self.client.pull(self.binding.params)
        self.binding.scatter_params()

    @abstractmethod
    def step(self, loss: float) -> StepOutcome:
        """One step, after ``backward()`` filled the model's gradients; pushes when a window completes."""

    def finish(self) -> StepOutcome | None:
        """Flush what a partial window accumulated; None when nothing was pending."""
        return None


class GradientProcedure(Procedure[GradientOptions]):
    """Push every step's raw gradient and take back the new parameters in the same round trip."""

    name = "gradient"
    options_type = GradientOptions

    def step(self, loss: float) -> StepOutcome:
        grads = self.binding.gradients_to_push()
        results = self.client.push(grads, ps_pb2.PAYLOAD_KIND_GRADIENT, pull_into=self.binding.params)
        self.binding.scatter_params()
        staleness, telemetry = _summarise(results)
        return StepOutcome(loss, True, staleness, telemetry)


class WindowedDeltaProcedure(Procedure[DeltaOptions]):
    """``λ`` local optimizer steps, then push the accumulated delta ``θ_end − θ_start``.

    DOWNPOUR and DynSGD push it as is, after local SGD; AGN (``normalize``) divides it by the
    steps done, so a final partial window pushes ``a / steps_done``. Local optimizer state
    persists across windows; after each push the model is overwritten with the pulled parameters.
    ``window`` is read at every step: a push reply that assigns local steps sets the next one.
    """

    name = "delta"
    options_type: ClassVar[type[Any]] = DeltaOptions
    normalize = False

    def __init__(
        self,
        client: ParameterService,
        binding: ModelBinding,
        options: DeltaOptions,
        build_optimizer: OptimizerFactory | None = None,
    ) -> None:
        super().__init__(client, binding, options, build_optimizer)
        self.window = options.window
        self.optimizer = self.local_optimizer([p for _, p in binding.named])
        self.window_start = torch.zeros_like(binding.params)
        self.delta = torch.zeros_like(binding.params)
        self.steps_done = 0

    def local_optimizer(self, parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        """The optimizer of the local steps: SGD at ``lr``, or the one AGN's server names."""
        options = self.options
        if isinstance(options, AgnOptions) and options.local_optimizer == "adam":
            return torch.optim.Adam(parameters, lr=options.lr)
        return torch.optim.SGD(parameters, lr=options.lr)

    def start(self) -> None:
        super().start()
        self.window_start.copy_(self.binding.params)

    def step(self, loss: float) -> StepOutcome:
        self.optimizer.step()
        self.steps_done += 1
        if self.steps_done < self.window:
            return StepOutcome(loss, False)
        return self._commit(loss)

    def finish(self) -> StepOutcome | None:
        return self._commit(float("nan")) if self.steps_done else None

    def _commit(self, loss: float) -> StepOutcome:
        current = self.binding.gather_params()
        torch.sub(current, self.window_start, out=self.delta)
        metadata = {"steps_done": float(self.steps_done)}
        if self.normalize:
            self.delta.div_(self.steps_done)
        results = self.client.push(self.delta, ps_pb2.PAYLOAD_KIND_DELTA, metadata, pull_into=self.binding.params)
        self.binding.scatter_params()
        self.window_start.copy_(self.binding.params)
        self.steps_done = 0
        self.window = assigned_window(results) or self.window
        staleness, telemetry = _summarise(results)
        return StepOutcome(loss, True, staleness, telemetry)


class AgnProcedure(WindowedDeltaProcedure):
    """Accumulated Gradient Normalization: the window's delta divided by the steps taken."""

    name = "agn"
    options_type = AgnOptions
    normalize = True


class DilocoProcedure(WindowedDeltaProcedure):
    """DiLoCo and Delayed Nesterov: ``H`` steps of the task's own inner optimizer, then push
    ``Δ = θ_end − θ_start`` (not divided by ``H``); the server's rule takes the outer step.

    The inner optimizer (plain SGD at ``local_lr`` when the task brings none) keeps its state
    across rounds and never sends it; only the parameters are overwritten with the pulled ones.
    """

    name = "diloco"
    options_type = DilocoOptions

    def __init__(
        self,
        client: ParameterService,
        binding: ModelBinding,
        options: DilocoOptions,
        build_optimizer: OptimizerFactory | None = None,
    ) -> None:
        super().__init__(client, binding, options.local_steps(), build_optimizer)

    def local_optimizer(self, parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        if self.build_optimizer is not None:
            return self.build_optimizer(parameters)
        return super().local_optimizer(parameters)


class EasgdProcedure(Procedure[EasgdOptions]):
    """Asynchronous EASGD (Zhang, Choromanska & LeCun, 2015); EAMSGD with ``local_momentum`` > 0.

    Local SGD (Nesterov momentum δ for EAMSGD); every ``λ`` steps: pull the centre ``x̃``,
    ``E = α (x − x̃)`` with ``α = η ρ``, ``x ← x − E``, push ``E`` (the server adds it to the centre).
    The worker never overwrites its own parameters with the centre. A push reply that assigns
    local steps sets the length of the next window.
    """

    name = "easgd"
    options_type = EasgdOptions

    def __init__(
        self,
        client: ParameterService,
        binding: ModelBinding,
        options: EasgdOptions,
        build_optimizer: OptimizerFactory | None = None,
    ) -> None:
        super().__init__(client, binding, options, build_optimizer)
        lr, momentum = options.lr, options.local_momentum
        self.window = options.window
        self.alpha = lr * options.rho
        parameters = [p for _, p in binding.named]
        self.optimizer = torch.optim.SGD(parameters, lr=lr, momentum=momentum, nesterov=momentum > 0)
        self.centre = torch.zeros_like(binding.params)
        self.elastic = torch.zeros_like(binding.params)
        self.steps_done = 0

    def step(self, loss: float) -> StepOutcome:
        self.optimizer.step()
        self.steps_done += 1
        if self.steps_done < self.window:
            return StepOutcome(loss, False)
        self.client.pull(self.centre)
        local = self.binding.gather_params()
        torch.sub(local, self.centre, out=self.elastic).mul_(self.alpha)
        local.sub_(self.elastic)
        self.binding.scatter_params()
        results = self.client.push(self.elastic, ps_pb2.PAYLOAD_KIND_DELTA, {"steps_done": float(self.steps_done)})
        self.steps_done = 0
        self.window = assigned_window(results) or self.window
        staleness, telemetry = _summarise(results)
        return StepOutcome(loss, True, staleness, telemetry)


# Above this many elements the median of π is taken over an even sample (telemetry only).
_PI_MEDIAN_SAMPLE = 1 << 20


class GemProcedure(Procedure[GemOptions]):
    """Gradient Energy Matching (Hermans & Louppe, 2018), computed element-wise by the worker.

    With ``s`` the parameters the gradient is computed on and ``m`` the proxy momentum::

        Δ ← −η ∇L(s);  m ← μ m + Δ;  θ ← pull()
        π ← clamp((κ |m| − |θ − s|) ⊘ (|Δ| + ε), 0, π_max);  push(π ⊙ Δ);  s ← θ (+ π ⊙ Δ if local_apply)

    ``atomic`` pulls exclusively (``reserve``): the shard applies no other commit between the pull
    and the push, as in the reference; otherwise pulls and pushes interleave freely (more throughput).
    The median of ``π`` goes to the server as ``pi_median`` for its telemetry.
    """

    name = "gem"
    options_type = GemOptions

    def __init__(
        self,
        client: ParameterService,
        binding: ModelBinding,
        options: GemOptions,
        build_optimizer: OptimizerFactory | None = None,
    ) -> None:
        super().__init__(client, binding, options, build_optimizer)
        self.lr = options.lr
        self.momentum = options.momentum
        self.kappa = options.kappa
        self.pi_max = options.pi_max
        self.epsilon = options.epsilon
        self.local_apply = options.local_apply
        self.atomic = options.atomic
        size = binding.params.numel()
        self.proxy_momentum = torch.zeros(size)
        self.delta = torch.zeros(size)
        self.centre = torch.zeros(size)
        self.pi = torch.zeros(size)
        self.scratch = torch.zeros(size)

    def step(self, loss: float) -> StepOutcome:
        grads = self.binding.gather_grads()
        torch.mul(grads, -self.lr, out=self.delta)
        self.proxy_momentum.mul_(self.momentum).add_(self.delta)
        self.client.pull(self.centre, reserve=self.atomic)
        s = self.binding.params
        # π = (κ|m| − |θ − s|) / (|Δ| + ε), in place over preallocated buffers.
        torch.sub(self.centre, s, out=self.scratch).abs_()
        torch.abs(self.proxy_momentum, out=self.pi).mul_(self.kappa).sub_(self.scratch)
        torch.abs(self.delta, out=self.scratch).add_(self.epsilon)
        self.pi.div_(self.scratch).clamp_(0.0, self.pi_max)
        update = self.delta.mul_(self.pi)
        pi_median = float(self._sample(self.pi).median())
        results = self.client.push(update, ps_pb2.PAYLOAD_KIND_DELTA, {"pi_median": pi_median})
        s.copy_(self.centre)
        if self.local_apply:
            s.add_(update)
        self.binding.scatter_params()
        staleness, telemetry = _summarise(results)
        telemetry.setdefault("pi_median", pi_median)
        return StepOutcome(loss, True, staleness, telemetry)

    @staticmethod
    def _sample(values: torch.Tensor) -> torch.Tensor:
        if values.numel() <= _PI_MEDIAN_SAMPLE:
            return values
        return values[:: values.numel() // _PI_MEDIAN_SAMPLE]


PROCEDURES: dict[str, type[Procedure[Any]]] = {
    cls.name: cls
    for cls in (GradientProcedure, WindowedDeltaProcedure, AgnProcedure, DilocoProcedure, EasgdProcedure, GemProcedure)
}


def procedure_class(rule: ps_pb2.RuleInfo) -> type[Procedure[Any]]:
    """The procedure class a rule names; ProcedureError when this worker does not implement it."""
    try:
        return PROCEDURES[rule.worker_procedure]
    except KeyError:
        raise ProcedureError(
            f"the server's rule {rule.name} needs worker procedure {rule.worker_procedure!r}, which this "
            f"worker does not implement (it knows {', '.join(PROCEDURES)}); upgrade psworker"
        ) from None


def build_procedure(
    client: ParameterService, binding: ModelBinding, build_optimizer: OptimizerFactory | None = None
) -> Procedure[Any]:
    """The procedure the server asked for in its Join reply, with the options it sent; procedures
    that take local steps with the task's own optimizer build it with ``build_optimizer``."""
    rule = client.rule
    cls = procedure_class(rule)
    return cls(client, binding, parse_options(cls.name, cls.options_type, rule.procedure_options), build_optimizer)
