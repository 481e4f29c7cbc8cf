"""Update rules, one module each, registered by name on import.

Every public module in this package is imported here, so a new rule only needs its own module.
Private modules (``_kernels``, ``_gap_kernel``) are helpers, loaded by the rules that use them.
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
