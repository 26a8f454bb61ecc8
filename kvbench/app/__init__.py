"""The application layer (issue #57), above every run and consumer of runs: the ``kvbench`` command and
``python run.py`` (``cli``), command-line overrides as Hydra composes them (``overrides``), the validation of a run
in one pass before any work (``validation``: the runner takes what it validated and never validates again), Hydra's
errors in words (``hydra_errors``), the catalogue (``listing``: ``kvbench list ...``), sweeps (``sweep``: plans and
SLURM manifests; ``sweep_sharing``: a local sweep's shared-prefill groups; ``shared_tasks``: a cluster launcher's),
the dashboards (``kvbench report``) and the embedded demo (``demo``).  Only the public API (``kvbench.api``) and the
lm-eval bridge sit above it.
"""
