"""hetps tools that run both sides on one machine: local cluster, simulator, in-process service, export."""
