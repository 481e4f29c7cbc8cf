"""The Fashion-MNIST CNN variants of the reproductions: each claim's experiment at this task's scale.

The ``fashion`` task is a ~420k-parameter CNN on 28×28 images (batch 64); a step costs about ten
times a digits CNN step and one evaluation on the 10,000 test images about 3 s on one core, so
the grids are smaller than digits' (the claim's own regime where we can afford it), the budgets
are a few hundred gradients per worker, and final-accuracy claims evaluate only at the end.
Learning rates are set for a CNN without batch normalisation: SGD 0.05, momentum (μ 0.9) 0.005.
"""

from __future__ import annotations

from experiments.repro_ab_sweep import FASHION_SWEEP, ab_sweep_experiment
from experiments.repro_common import Experiment, Scale
from experiments.repro_experiments import agn_experiment, ga_experiment, gem_experiment, ormo_experiment, ttt_experiment

TASK = "fashion"
WORDS = "Fashion-MNIST CNN"
TARGET = 0.85
TTT_EVAL_EVERY = 250
TTT_RULES: dict[str, tuple[str, dict[str, str], str]] = {
    # label -> (rule, options, consistency); BSP averages four gradients, so it takes twice ASGD's rate
    "ASGD": ("asgd", {"lr": "0.05"}, "async"),
    "SA": ("sa", {"lr": "0.1"}, "async"),
    "GA": ("gap-aware", {"lr": "0.1"}, "async"),
    "OrMo": ("ormo", {"lr": "0.005"}, "async"),
    "BSP (SGD)": ("asgd", {"lr": "0.1"}, "bsp"),
}

AGN = Scale(TASK, WORDS, steps=600, xs=(5, 20), lrs=("0.001", "0.05"), windows=(20,))
GA = Scale(
    TASK, WORDS, steps=400, xs=(4, 32), lrs=("0.05", "0.005"), series=("SA", "GA", "momentum ASGD", "GA + momentum")
)
GEM = Scale(TASK, WORDS, steps=400, xs=(5, 50), lrs=("0.05", "0.1"), series=("GEM", "DOWNPOUR"))
ORMO = Scale(TASK, WORDS, steps=400, xs=(4, 16), lrs=("0.005",), series=("1:1:2:4",))
TTT = Scale(TASK, WORDS, steps=3000, xs=(4,))


def fashion_experiments() -> list[Experiment]:
    """Every claim on the Fashion-MNIST CNN, in the digits report's order."""
    return [
        agn_experiment(False, AGN),
        ab_sweep_experiment(FASHION_SWEEP),
        ga_experiment(False, GA),
        gem_experiment(False, GEM),
        ormo_experiment(False, ORMO),
        ttt_experiment(False, TTT, TTT_RULES, TARGET, TTT_EVAL_EVERY),
    ]
