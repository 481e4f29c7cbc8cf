"""What every benchmark script shares; the scripts themselves hold only their measurement.

- :mod:`~benchmarks.harness.settings` — how long and how much to measure (``--quick``, ``--smoke``).
- :mod:`~benchmarks.harness.models` — the models by name (ResNet-18 size, small, tiny).
- :mod:`~benchmarks.harness.processes` — server processes, started and found through ready files; CPU and RSS.
- :mod:`~benchmarks.harness.steps` — hetps, the bare gRPC mover and the peer behind one step interface.
- :mod:`~benchmarks.harness.pool` — worker processes driven in timed bursts.
- :mod:`~benchmarks.harness.memory` — what a server must hold and its RSS limit.
- :mod:`~benchmarks.harness.stats` — summaries and ratios.
- :mod:`~benchmarks.harness.report` — options, the machine, targets, tables and JSON.
"""
