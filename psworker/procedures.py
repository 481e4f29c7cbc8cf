"""Worker procedures: what a worker does each step for the rule the server runs.

The server names the procedure in its Join reply (``RuleInfo.worker_procedure``) with its
options; a worker runs exactly that one. Every procedure keeps the model's parameters in
step with what it last pulled or computed, and pushes through the client's flat buffers.

- ``gradient``: push the raw gradient of every step (ASGD, SA, momentum, GA, AB, OrMo...).
- ``delta``: windowed DOWNPOUR/DynSGD: ``λ`` local SGD steps, push ``θ_end − θ_start``.
- ``agn``: like ``delta`` with any local optimizer, the window's delta divided by the steps done.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from psproto.v1 import ps_pb2
from psworker.binding import ModelBinding
from psworker.client import PSClient, PushResult


@dataclass
class StepOutcome:
    loss: float
    pushed: bool
    staleness: int = 0
    telemetry: dict[str, float] = field(default_factory=dict)


def _summarise(results: list[PushResult]) -> tuple[int, dict[str, float]]:
    staleness = max(r.staleness for r in results)
    telemetry: dict[str, float] = {}
    for result in results:
        for key, value in result.telemetry.items():
            telemetry[key] = telemetry.get(key, 0.0) + value / len(results)
    return staleness, telemetry


class ProcedureError(ValueError):
    """The server asked for a procedure or an option this worker does not know."""


class Procedure(ABC):
    name: str

    def __init__(self, client: PSClient, binding: ModelBinding, options: Mapping[str, str]) -> None:
        self.client = client
        self.binding = binding
        self.options = dict(options)

    def option(self, key: str, kind: type, default: object = None) -> object:
        if key not in self.options:
            if default is None:
                raise ProcedureError(f"procedure {self.name} needs option {key!r} from the server")
            return default
        text = self.options[key]
        if kind is bool:
            return text.lower() in {"1", "true", "yes", "on"}
        try:
            return kind(text)
        except ValueError:
            raise ProcedureError(f"procedure {self.name}: option {key}={text!r} is not a {kind.__name__}") from None

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


class GradientProcedure(Procedure):
    """Push every step's raw gradient and take back the new parameters in the same round trip."""

    name = "gradient"

    def step(self, loss: float) -> StepOutcome:
        grads = self.binding.gather_grads()
        results = self.client.push(grads, ps_pb2.PAYLOAD_KIND_GRADIENT, pull_into=self.binding.params)
        self.binding.scatter_params()
        staleness, telemetry = _summarise(results)
        return StepOutcome(loss, True, staleness, telemetry)


class WindowedDeltaProcedure(Procedure):
    """``λ`` local optimizer steps, then push the accumulated delta ``θ_end − θ_start``.

    DOWNPOUR and DynSGD push it as is; AGN (``normalize``) divides it by the steps done, so a
    final partial window pushes ``a / steps_done``. Local optimizer state persists across
    windows; after each push the model is overwritten with the pulled parameters.
    """

    name = "delta"
    normalize = False

    def __init__(self, client: PSClient, binding: ModelBinding, options: Mapping[str, str]) -> None:
        super().__init__(client, binding, options)
        window = self.option("window", int)
        assert isinstance(window, int)
        if window < 1:
            raise ProcedureError(f"window must be >= 1, got {window}")
        self.window = window
        lr = self.option("lr", float)
        assert isinstance(lr, float)
        parameters = [p for _, p in binding.named]
        optimizer = str(self.option("local_optimizer", str, "sgd"))
        if optimizer == "adam":
            self.optimizer: torch.optim.Optimizer = torch.optim.Adam(parameters, lr=lr)
        elif optimizer == "sgd":
            self.optimizer = torch.optim.SGD(parameters, lr=lr)
        else:
            raise ProcedureError(f"local_optimizer {optimizer!r} is not sgd or adam")
        self.window_start = torch.zeros_like(binding.params)
        self.delta = torch.zeros_like(binding.params)
        self.steps_done = 0

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
        staleness, telemetry = _summarise(results)
        return StepOutcome(loss, True, staleness, telemetry)


class AgnProcedure(WindowedDeltaProcedure):
    """Accumulated Gradient Normalization: the window's delta divided by the steps taken."""

    name = "agn"
    normalize = True


PROCEDURES: dict[str, type[Procedure]] = {
    cls.name: cls for cls in (GradientProcedure, WindowedDeltaProcedure, AgnProcedure)
}


def build_procedure(client: PSClient, binding: ModelBinding) -> Procedure:
    """The procedure the server asked for in its Join reply."""
    rule = client.rule
    try:
        cls = PROCEDURES[rule.worker_procedure]
    except KeyError:
        raise ProcedureError(
            f"the server's rule {rule.name} needs worker procedure {rule.worker_procedure!r}, which this "
            f"worker does not implement (it knows {', '.join(PROCEDURES)}); upgrade psworker"
        ) from None
    return cls(client, binding, rule.procedure_options)
