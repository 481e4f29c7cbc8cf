"""Start-up of a worker, in one place: Init the server if nobody has, build its procedure, start it.

``ParameterServerOptimizer``, ``psworker train`` and the simulator all begin here, so every
worker starts the same way whatever service carries it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psworker.binding import ModelBinding
from psworker.procedures import Procedure, build_procedure
from psworker.service import ParameterService
from psworker.task import OptimizerFactory


def start_worker(
    service: ParameterService,
    binding: ModelBinding,
    on_init: Callable[[bool], None] | None = None,
    build_optimizer: OptimizerFactory | None = None,
) -> Procedure[Any]:
    """Init the shards from the model if they hold no parameters, then build and start the procedure
    the server named in its Join reply. ``on_init(applied)`` hears whether this worker's Init won;
    ``build_optimizer`` is the task's own optimizer, for procedures whose local steps use it."""
    if not service.initialized:
        applied = service.init(binding.gather_params())
        if on_init is not None:
            on_init(applied)
    procedure = build_procedure(service, binding, build_optimizer)
    procedure.start()
    return procedure
