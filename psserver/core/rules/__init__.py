"""Update rules, one module each, registered by name on import.

Every public module in this package is imported here, so adding a rule touches its module, its
test and nothing else: the ``@register`` decorator is the registry. Private modules are helpers
that only the rules using them load (``_kernels``, ``_gap_kernel``; ``_windowed`` for the rules
whose workers take local steps; ``_pull_hold`` for ``diloco-dn``).

A rule module declares:

- a frozen options dataclass (``RuleOptions``, every field an ``option(...)`` with its help and
  range), and ``consistency_refusal`` when some options cannot run under a consistency model;
- a ``@register``-ed ``UpdateRule`` subclass: ``name``, ``summary``, ``options_type``,
  ``accepted_kinds`` (gradient or delta), ``worker_procedure`` and ``procedure_options`` (what
  the worker runs, sent in the Join reply), ``needs_snapshot`` (the parameters each worker
  pulled), ``spannable``; ``apply`` (its equation, in place on flat tensors, returning
  telemetry); ``state_tensors`` / ``load_state_tensors`` (checkpoints);
- its scheduling, through hooks the shard calls under its lock with a ``ShardView`` (the clock,
  the live workers, their measured paces) and whose decisions it carries out
  (``psserver.core.scheduling``). Each default does nothing, so most rules write none:

  ``on_pull`` / ``on_leave``  per-worker state a pull records, or a departure frees;
  ``exclusive_pull_refusal``  whether a worker may pull exclusively (no other push applied until
                              its own; GEM's atomic mode); refused by default;
  ``pull_wait``               a ``Wait`` before a pull is answered (another worker's exclusive pull,
                              DN's hold until pushes landing together are applied);
  ``pull_taken``              the pull goes ahead: take what it holds; ``PullTaken.restart_window``
                              when the worker's window of local steps begins now;
  ``pull_hold`` / ``pull_hold_pending``  the hold on a worker's next pull, for the simulator;
  ``push_wait`` / ``push_taken``  a ``Wait`` before a push is applied; it goes ahead;
  ``push_has_priority``       its pushes never queue for a receive buffer (others wait on them);
  ``paced_window``            have the shard measure each worker's pace from its push timing;
  ``after_push``              a ``PushDecision`` after an applied push: telemetry for the reply,
                              such as the worker's next window of local steps (``local_steps``).

  Per-worker scheduling state lives in the rule, keyed by worker id; worker records stay plain
  data.
"""

from __future__ import annotations

import importlib
import pkgutil

from psserver.core.rules.base import (
    RULES,
    PayloadKind,
    PushContext,
    RuleSpec,
    Telemetry,
    UpdateRule,
    register,
    rule_class,
)
from psserver.core.rules.options import RuleOptionError, RuleOptions, option

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_") and _module.name not in {"base", "options"}:
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "RULES",
    "PayloadKind",
    "PushContext",
    "RuleOptionError",
    "RuleOptions",
    "RuleSpec",
    "Telemetry",
    "UpdateRule",
    "option",
    "register",
    "rule_class",
]
