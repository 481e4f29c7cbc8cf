"""``psserver``: the command group (serve a shard, list the update rules, show a server's status,
check a checkpoint folder).

The commands live in ``psserver.serve_cli`` (serve) and ``psserver.admin_cli`` (rules, status,
checkpoint, checkpoints, top); the flag parsers in ``psserver.flags``. ``serve`` brings torch and
the whole server with it, so it is imported only when it runs (or its own help is asked for): the
admin commands an operator types, or a probe runs, start without them.
"""

from __future__ import annotations

import importlib

import click

from psserver.admin_cli import checkpoint_command, checkpoints_command, rules, status, top

# Commands imported when they are used: name -> (module, attribute, the command's help text for
# `psserver --help`, which tests/psserver/test_cli.py keeps equal to the command's own).
LAZY_COMMANDS: dict[str, tuple[str, str, str]] = {
    "serve": ("psserver.serve_cli", "serve", "Serve one shard of a model's parameters over gRPC until SIGTERM."),
}


class _LazyGroup(click.Group):
    """A click group that imports some commands only when they are looked up by name."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in LAZY_COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, attribute, _ = LAZY_COMMANDS[cmd_name]
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command), f"{module}.{attribute} is not a click command"
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``psserver --help``, as click writes it, without importing the lazy commands."""
        shown: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            if name in LAZY_COMMANDS:
                # A stand-in with the same help: click shortens it as it would the command's own.
                command: click.Command | None = click.Command(name, help=LAZY_COMMANDS[name][2])
            else:
                command = super().get_command(ctx, name)
            if command is not None and not command.hidden:
                shown.append((name, command))
        if shown:
            limit = formatter.width - 6 - max(len(name) for name, _ in shown)
            with formatter.section("Commands"):
                formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in shown])


@click.group(cls=_LazyGroup)
def main() -> None:
    """hetps parameter server."""


for command in (rules, status, checkpoint_command, checkpoints_command, top):
    main.add_command(command)


if __name__ == "__main__":
    main()
