"""Benchmarks: a shared harness (``benchmarks.harness``) and one script per performance measurement (tables and JSON).

Paper reproductions and time-to-accuracy races are experiments, not measurements of speed: they
live in :mod:`experiments`, which may use this harness (this package never imports them).
"""
