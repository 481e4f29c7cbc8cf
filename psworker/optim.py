"""An optimizer-like wrapper so a plain PyTorch loop trains against hetps by changing two lines.

opt = ParameterServerOptimizer(model, "127.0.0.1:50051")   # instead of torch.optim.SGD(...)
for x, y in loader:
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()                                              # push, then take the new parameters
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from psproto.security import ClientTls
from psworker.binding import ModelBinding
from psworker.channels import DEFAULT_KEEPALIVE_S
from psworker.client import ClientConfig, PSClient
from psworker.procedures import StepCounts, StepOutcome
from psworker.startup import start_worker
from psworker.task import OptimizerFactory


class ParameterServerOptimizer:
    """Joins the server, initialises it from the model if nobody has, and runs the server's procedure."""

    def __init__(
        self,
        model: nn.Module,
        servers: str | Sequence[str],
        name: str | None = None,
        wire_dtype: str = "fp32",
        tls: ClientTls | None = None,
        auth_token: str | None = None,
        keepalive_seconds: float = DEFAULT_KEEPALIVE_S,
        build_optimizer: OptimizerFactory | None = None,
    ) -> None:
        """``tls`` and ``auth_token`` go to ``PSClient`` as they are: TLS (mutual TLS with a client
        certificate) and the bearer token of servers started with --tls-* and --auth-token-file;
        ``keepalive_seconds``, the HTTP/2 ping interval (a silent link is noticed within 1.5 of it);
        ``build_optimizer``, the inner optimizer of rules whose local steps use the model's own
        (``diloco``, ``diloco-dn``), e.g. ``lambda ps: torch.optim.AdamW(ps, lr=1e-3)``."""
        config = ClientConfig(
            wire_dtype=wire_dtype, tls=tls, auth_token=auth_token, keepalive_seconds=keepalive_seconds
        )
        self._start(model, servers, name, config, build_optimizer)

    @classmethod
    def configured(
        cls,
        model: nn.Module,
        servers: str | Sequence[str],
        name: str | None,
        config: ClientConfig,
        build_optimizer: OptimizerFactory | None = None,
    ) -> ParameterServerOptimizer:
        """The same, with every client setting in ``config`` (retries, deadlines, chunking, a name
        taken over from a dead worker ...)."""
        optimizer = cls.__new__(cls)
        optimizer._start(model, servers, name, config, build_optimizer)
        return optimizer

    def _start(
        self,
        model: nn.Module,
        servers: str | Sequence[str],
        name: str | None,
        config: ClientConfig,
        build_optimizer: OptimizerFactory | None,
    ) -> None:
        addresses = [servers] if isinstance(servers, str) else list(servers)
        self.model = model
        self.binding = ModelBinding(model, num_shards=len(addresses))
        device = str(self.binding.device)
        self.client = PSClient(addresses, self.binding.layout, name=name, device=device, config=config)
        self.procedure = start_worker(self.client, self.binding, build_optimizer=build_optimizer)
        self.last: StepOutcome | None = None
        self.counts = StepCounts()

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=False)

    def step(self, loss: float = float("nan")) -> StepOutcome:
        """Hand the gradients now in the model to the server's procedure."""
        self.last = self.procedure.step(loss)
        self.counts.count(self.last)
        return self.last

    def close(self) -> None:
        """Flush a partial window and leave the server."""
        self.procedure.finish()
        self.client.close()

    def __enter__(self) -> ParameterServerOptimizer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
