"""Which reproductions exist: the experiments of each task family, as ``--tasks`` and ``--only`` select them."""

from __future__ import annotations

from collections.abc import Sequence

from experiments.repro_ab_sweep import DIGITS_SWEEP, ab_sweep_experiment
from experiments.repro_common import Experiment
from experiments.repro_experiments import (
    ab_experiment,
    agn_experiment,
    ga_experiment,
    gem_experiment,
    ormo_experiment,
    ttt_experiment,
)
from experiments.repro_fashion import fashion_experiments
from experiments.repro_local_sgd import local_sgd_experiments

TASKS = ("digits", "fashion", "tinylm")


def experiments(quick: bool, only: set[str] | None = None, tasks: Sequence[str] = TASKS) -> list[Experiment]:
    """The experiments of ``tasks`` (digits, fashion, tinylm), all or those whose key is in ``only``.

    ``quick`` keeps the smoke test's digits subset whatever ``tasks`` says.
    """
    if quick:
        built = [ga_experiment(True), ttt_experiment(True)]
    else:
        built = []
        if "digits" in tasks:
            builders = [agn_experiment, ab_experiment, ga_experiment, gem_experiment, ormo_experiment, ttt_experiment]
            built += [b(False) for b in builders]
            built.insert(2, ab_sweep_experiment(DIGITS_SWEEP))
        if "fashion" in tasks:
            built += fashion_experiments()
        built += local_sgd_experiments(tuple(tasks))
    return [e for e in built if only is None or e.key in only]
