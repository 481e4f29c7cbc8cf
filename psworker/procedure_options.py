"""Each worker procedure's options, typed, parsed in one place from what the server sends.

The server's rules send their procedure options complete (every default filled in, as
strings) in the Join reply's ``RuleInfo.procedure_options``; this module turns them into one
frozen dataclass per procedure. It holds no defaults of its own: an option the server did not
send is an error naming it, so the server stays the one place that decides every value.
Options the worker does not know are ignored (a newer server may send more).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from psproto.booleans import parse_bool


class ProcedureError(ValueError):
    """The server asked for a procedure or an option this worker does not know."""


@dataclass(frozen=True)
class GradientOptions:
    """The ``gradient`` procedure takes no options: the server's rule does everything."""


@dataclass(frozen=True)
class DeltaOptions:
    """``delta`` (DOWNPOUR, DynSGD): ``window`` local SGD steps at ``lr``, then push the delta."""

    lr: float
    window: int

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ProcedureError(f"window must be >= 1, got {self.window}")


@dataclass(frozen=True)
class AgnOptions(DeltaOptions):
    """``agn``: as ``delta`` with the local optimizer the server names."""

    local_optimizer: str

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.local_optimizer not in {"sgd", "adam"}:
            raise ProcedureError(f"local_optimizer {self.local_optimizer!r} is not sgd or adam")


@dataclass(frozen=True)
class DilocoOptions:
    """``diloco`` (DiLoCo, Delayed Nesterov): ``window`` steps of the task's own optimizer, then push
    the delta. ``local_lr`` is for plain SGD when the task brings no optimizer; the rule's ``lr`` is
    the server's outer rate and not the worker's."""

    local_lr: float
    window: int

    def local_steps(self) -> DeltaOptions:
        """The windowed-delta options these amount to (checked there)."""
        if self.local_lr <= 0:
            raise ProcedureError(f"local_lr must be > 0, got {self.local_lr}")
        return DeltaOptions(lr=self.local_lr, window=self.window)


@dataclass(frozen=True)
class EasgdOptions:
    """``easgd`` (EASGD, EAMSGD with ``local_momentum`` > 0)."""

    lr: float
    rho: float
    window: int
    local_momentum: float

    def __post_init__(self) -> None:
        if self.window < 1 or self.lr <= 0 or self.rho <= 0 or not 0 <= self.local_momentum < 1:
            raise ProcedureError(
                f"easgd options out of range: window={self.window} lr={self.lr} rho={self.rho} δ={self.local_momentum}"
            )


@dataclass(frozen=True)
class GemOptions:
    """``gem``: Gradient Energy Matching (see :class:`psworker.procedures.GemProcedure`)."""

    lr: float
    momentum: float
    kappa: float
    pi_max: float
    epsilon: float
    local_apply: bool
    atomic: bool


OptionsT = TypeVar("OptionsT")


def _convert(procedure: str, key: str, text: str, kind: Any) -> object:
    try:
        if kind is bool:
            return parse_bool(text)
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
    except ValueError:
        what = {bool: "true or false", int: "an integer", float: "a number"}[kind]
        raise ProcedureError(f"procedure {procedure}: option {key}={text!r} is not {what}") from None
    return text


def parse_options(procedure: str, options_type: type[OptionsT], sent: Mapping[str, str]) -> OptionsT:
    """``options_type`` built from the server's strings; a missing or malformed option raises ProcedureError."""
    hints = typing.get_type_hints(options_type)
    values: dict[str, object] = {}
    for field in dataclasses.fields(options_type):  # type: ignore[arg-type]
        text = sent.get(field.name)
        if text is None:
            raise ProcedureError(f"procedure {procedure} needs option {field.name!r} from the server")
        values[field.name] = _convert(procedure, field.name, text, hints[field.name])
    return options_type(**values)
