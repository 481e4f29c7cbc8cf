"""Call metadata keys that servers send and workers read (docs/protocol.md names each).

``SHARD_CLOCK``: in the trailing metadata of every Pull and PushPull reply, the shard's clock (decimal)
when it answered the pull. It is per call, because the reply messages of a version are built once and
shared by all its readers, and it may be above the clock of the parameters sent (an older version
still being sent to others): a worker checks it, not theirs, for a rollback.
"""

from __future__ import annotations

SHARD_CLOCK = "hetps-shard-clock"
