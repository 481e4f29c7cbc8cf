"""Benchmarks: scripts that print a table and write JSON; never run by the test suite."""
