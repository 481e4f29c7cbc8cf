"""The configuration file of ``psserver serve --config``: the generic TOML reading of
:mod:`psproto.config_file` (the worker's commands read theirs with the same code), under the name
the server's modules import it by."""

from psproto.config_file import (
    AUTO,
    ConfigFileError,
    Converters,
    build,
    docstrings,
    dump_toml,
    merged,
    read_toml,
)

__all__ = ["AUTO", "ConfigFileError", "Converters", "build", "docstrings", "dump_toml", "merged", "read_toml"]
