"""Model architectures for the built-in tasks."""
