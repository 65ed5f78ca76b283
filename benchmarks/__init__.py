"""Benchmarks: run as modules (``python -m benchmarks.<name>``); never part of the test suite."""
