"""``python -m kvbench.lmeval <lm_eval arguments>``: lm-eval's command line with ``--model kvbench`` registered.

lm-eval discovers models only among its own modules (or ones already imported), so its plain ``lm_eval`` command
does not know ``kvbench``; this entry registers it and hands every argument to lm-eval unchanged::

    python -m kvbench.lmeval run --model kvbench \\
        --model_args pretrained=qwen2-1.5b,method=snapkv,budget=0.2x,question_mode=agnostic \\
        --tasks arc_easy,openbookqa,wic,winogrande
"""

from __future__ import annotations

from kvbench.lmeval import register


def main() -> None:
    """Register the model, then run lm-eval's CLI on ``sys.argv``."""
    register()
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
