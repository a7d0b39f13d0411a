"""Benchmarks runnable as `jaxserve bench <name>`."""
