"""Experiments: paper reproductions (``experiments.reproduce``) and time-to-accuracy races
(``experiments.time_to_accuracy``, reported by ``experiments.tta_report``).

They train real tasks to a target and compare rules; the performance measurements (bytes, steps,
memory) are in :mod:`benchmarks`, whose harness these scripts share. Nothing imports them.
"""
