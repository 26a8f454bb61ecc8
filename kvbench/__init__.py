"""kvbench: a reproducible benchmark harness for KV-cache eviction research."""

__version__ = "0.1.0"
