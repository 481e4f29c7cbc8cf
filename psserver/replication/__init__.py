"""Replicated shards: one primary and its backups per shard, leadership held in etcd.

``config`` (the ``[replication]`` table), ``state_wire`` (a shard's state as bytes and back),
``coordinator`` (etcd: the lease, the election, the in-sync set), ``backups`` (the primary's side:
its state sent to every backup, acknowledgements held until the in-sync ones hold it),
``standby`` (a backup's side: the newest state held, older epochs fenced), ``node`` (one replica's
role over time: candidate, backup, primary, deposed). docs/operations.md states the guarantee.
"""
