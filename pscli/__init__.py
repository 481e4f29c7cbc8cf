"""What every hetps command line shares, below both sides: ``psserver``'s commands and the
``psworker`` commands (``pstasks``, ``pstools``) read configuration and show help alike.

- ``config_file``: a ``--config`` TOML file read, merged under the flags, and built into a typed
  configuration, every key and type checked (``ConfigFileError`` names the key); dumped back for
  the files a launcher writes.
- ``help_sections``: a command whose ``--help`` lists its options under headings.

It imports click and the standard library, never another hetps package, so the server and the
worker can both rest on it without importing each other.
"""
