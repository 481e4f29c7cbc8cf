"""hetps on Ray: a job's shards and groups of workers as Ray actors placed by resources.

``pip install 'hetps[ray]'``; ``psworker cluster --ray ADDRESS`` on the command line, or::

    from pstools.launcher import ClusterConfig
    from pstools.on_ray import RayJobConfig, RaySettings, WorkerGroup, run_job

    groups = (
        WorkerGroup("a100", 2, num_gpus=1, resources={"a100": 1}),
        WorkerGroup("t4", 4, num_gpus=1, resources={"t4": 1}, slowdown=1.0),
    )
    job = RayJobConfig(ClusterConfig(task="fashion", until_clock=3000), RaySettings(groups=groups))
    report = run_job(job, "auto")

docs/ray.md tells the rest.
"""

from pstools.on_ray.actors import WorkerContext
from pstools.on_ray.config import RayJobConfig, RaySettings, WorkerGroup
from pstools.on_ray.job import RayJob, RayJobError, run_job

__all__ = ["RayJob", "RayJobConfig", "RayJobError", "RaySettings", "WorkerContext", "WorkerGroup", "run_job"]
