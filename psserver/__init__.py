"""The hetps parameter server: one process serves one shard of a model's parameters."""
