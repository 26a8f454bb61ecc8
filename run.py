#!/usr/bin/env python
"""kvbench entry point: ``python run.py [model=...] [method=...] [budget=...] [task=...] [key=value ...]``.

The same app as the ``kvbench`` console script (``pip install .``): both call :func:`kvbench.app.cli.main`.
With no arguments it runs the embedded default (a tiny model on an offline synthetic retrieval task, CPU, no
network) next to a few variants (full cache, StreamingLLM, question-agnostic) and prints them side by side.
``python run.py -m ...`` sweeps (Hydra multirun); ``python run.py list methods|tasks|models|budgets`` lists the
presets with their parameters and defaults.  See README.md.

Every user error -- Hydra's (unknown preset, misspelt key, wrongly typed value) or kvbench's (bad value, missing
data, model or package) -- exits with status 2 and one paragraph on stderr, without a traceback unless
``KVBENCH_DEBUG=1``.  The checks that need no torch run before torch is imported (kvbench/app/validation.py).
"""

from kvbench.app.cli import main

if __name__ == "__main__":
    main()
