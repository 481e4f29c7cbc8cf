"""What the time-to-accuracy races share beyond :mod:`benchmarks.harness`.

- :mod:`~experiments.harness.race` — one race: a server and workers of mixed speeds (or DDP), started on a signal.
- :mod:`~experiments.harness.race_workers` — the workers of a race, in child processes.
- :mod:`~experiments.harness.snapshots` — parameter snapshots during a race and their scores afterwards.
- :mod:`~experiments.harness.scoring` — scoring snapshots in the background, between races.
- :mod:`~experiments.harness.link` — an emulated shared network link (tc in a network namespace).
"""
