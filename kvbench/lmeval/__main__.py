"""``python -m kvbench.lmeval <lm_eval arguments>``: lm-eval's command line with ``--model kvbench`` registered.

lm-eval discovers models only among its own modules (or ones already imported), so its plain ``lm_eval`` command
does not know ``kvbench``; this entry registers it and hands every argument to lm-eval unchanged::

    python -m kvbench.lmeval run --model kvbench \\
        --model_args pretrained=qwen2-1.5b,method=snapkv,budget=0.2x,question_mode=agnostic \\
        --tasks arc_easy,openbookqa,wic,winogrande
"""

from __future__ import annotations

import sys

from kvbench.errors import USER_ERROR_EXIT, KVBenchError, environment_error_message
from kvbench.lmeval import register


def main() -> None:
    """Check ``--model_args`` of ``--model kvbench`` (:mod:`kvbench.lmeval.args`), register the model, then run
    lm-eval's CLI on ``sys.argv``.  A bad value -- found before lm-eval loads a task or the model, or by kvbench
    later (a damaged model folder included) -- and a full disk or refused permission are one paragraph on stderr and
    exit status 2, as with ``run.py``."""
    from kvbench.app.cli import report_user_error
    from kvbench.lmeval.args import precheck_argv

    try:
        precheck_argv(sys.argv[1:])
        register()
        from lm_eval.__main__ import cli_evaluate

        cli_evaluate()
    except KVBenchError as err:
        report_user_error(str(err))
        sys.exit(USER_ERROR_EXIT)
    except OSError as err:  # disk full, permission denied, a file in the way: named; any other OSError is a bug
        message = environment_error_message(err)
        if message is None:
            raise
        report_user_error(message)
        sys.exit(USER_ERROR_EXIT)


if __name__ == "__main__":
    main()
