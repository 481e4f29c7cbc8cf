"""``psserver``: the command group (serve a shard, list the update rules, show a server's status,
check a checkpoint folder).

The commands live in ``psserver.serve_cli`` (serve) and ``psserver.admin_cli`` (rules, status,
checkpoint, checkpoints, top); the flag parsers in ``psserver.flags``, re-exported here for the worker's
commands and the benchmarks that share them.
"""

from __future__ import annotations

import click

from psserver.admin_cli import checkpoint_command, checkpoints_command, rules, status, top
from psserver.flags import parse_checkpoint_every, parse_receive_window, parse_rule
from psserver.serve_cli import serve

__all__ = ["main", "parse_checkpoint_every", "parse_receive_window", "parse_rule"]


@click.group()
def main() -> None:
    """hetps parameter server."""


for command in (serve, rules, status, checkpoint_command, checkpoints_command, top):
    main.add_command(command)


if __name__ == "__main__":
    main()
