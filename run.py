#!/usr/bin/env python
"""kvbench entry point: ``python run.py [model=...] [method=...] [budget=...] [task=...] [key=value ...]``.

With no arguments it runs the embedded default (a tiny model on an offline synthetic retrieval task, CPU, no
network) next to a few variants (full cache, StreamingLLM, question-agnostic) and prints them side by side.
``python run.py -m ...`` sweeps (Hydra multirun).  See README.md.

Every user error -- Hydra's (unknown preset, misspelt key, wrongly typed value) or kvbench's (bad value, missing
data, model or package) -- exits with status 2 and one paragraph on stderr, without a traceback unless
``KVBENCH_DEBUG=1``.  The checks that need no torch run before torch is imported (kvbench/validation.py).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Hydra raises its own errors instead of printing them (exit 1); kvbench.cli reports them as user errors (exit 2).
os.environ["HYDRA_FULL_ERROR"] = "1"

import hydra
from omegaconf import DictConfig

from kvbench.cli import reporting_hydra_errors, run_job
from kvbench.config import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Run one configuration (Hydra calls this once per job in a sweep)."""
    # `python run.py` alone: the embedded default, side by side with its variants.
    run_job(cfg, demo=len(sys.argv) == 1)


if __name__ == "__main__":
    with reporting_hydra_errors(sys.argv[1:]):
        main()
