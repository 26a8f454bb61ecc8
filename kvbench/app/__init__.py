"""The application layer (issue #57): command-line overrides as Hydra composes them (``overrides``), the
validation of a run before any work (``validation``), Hydra's errors in words (``hydra_errors``) and the
catalogue (``listing``: ``kvbench list ...``).  Below the runner, which validates with it; the entry points
(``kvbench.cli``, ``kvbench.api``) sit above.
"""
