"""Benchmark harness (see benchmarks/run.py)."""
