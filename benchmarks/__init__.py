"""Benchmarks: a shared harness (``benchmarks.harness``) and one script per measurement (tables and JSON)."""
