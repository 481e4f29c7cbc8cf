"""The hetps Python worker: client library, training loop, tasks and CLI."""
