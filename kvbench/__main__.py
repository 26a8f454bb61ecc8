"""``python -m kvbench [overrides ...]``: the same app as the ``kvbench`` console script and ``python run.py``."""

from kvbench.app.cli import main

if __name__ == "__main__":
    main()
