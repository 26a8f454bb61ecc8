#!/usr/bin/env python
"""kvbench entry point: ``python run.py [model=...] [method=...] [budget=...] [task=...] [key=value ...]``.

With no arguments it runs the embedded default (a tiny model on an offline synthetic retrieval task, CPU, no
network) next to a few variants (full cache, StreamingLLM, question-agnostic) and prints them side by side.
``python run.py -m ...`` sweeps (Hydra multirun).  See README.md.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra
from omegaconf import DictConfig

from kvbench.config import register_configs
from kvbench.errors import KVBenchError

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Run one configuration (Hydra calls this once per job in a sweep)."""
    from kvbench.runner import Interrupted, Runner

    try:
        if len(sys.argv) == 1:  # `python run.py` alone: the embedded default, side by side with its variants
            from kvbench.demo import run_demo

            run_demo(cfg)
        else:
            Runner(cfg).run()
    except KVBenchError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except Interrupted as err:
        print(f"interrupted ({err}); predictions so far are saved, rerun the same command to resume", file=sys.stderr)
        sys.exit(143)


if __name__ == "__main__":
    main()
