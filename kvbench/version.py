"""kvbench's version (recorded in every run's ``run_meta.json``), below every other module so that the runner reads
it without importing the package's public API (:mod:`kvbench` re-exports it)."""

__version__ = "0.1.0"
