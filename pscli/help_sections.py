"""A command whose ``--help`` lists its options under headings, for every hetps command."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click


class SectionedCommand(click.Command):
    """Lists a command's options under headings (``sections``: heading -> option names); options no
    section names come last, under "Other"."""

    def __init__(self, *args: Any, sections: Mapping[str, tuple[str, ...]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sections = sections

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records = {param.name: param.get_help_record(ctx) for param in self.get_params(ctx)}
        listed = {name for names in self.sections.values() for name in names}
        rest = [record for name, record in records.items() if name not in listed and record is not None]
        for heading, names in [*self.sections.items(), ("Other", ())]:
            rows = [record for name in names if (record := records.get(name)) is not None]
            if rows or (heading == "Other" and rest):
                with formatter.section(heading):
                    formatter.write_dl(rows or rest)
