"""Fakes of our own ports, for unit tests of pure logic and for benchmarks."""
