"""``task=lmeval``: lm-evaluation-harness tasks (``task.lm_eval_tasks``), evaluated by :mod:`kvbench.lmeval.runner`.

Registered here so the task kind is known without lm-eval installed (validation, ``kvbench list``); building the
datasets needs the ``lmeval`` extra and says so when it is missing.
"""

from __future__ import annotations

from typing import Any

from kvbench.tasks.base import TaskDataset, register_task


@register_task("lmeval")
def build_lmeval(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """One dataset per lm-eval task of ``task.lm_eval_tasks`` (groups expanded; ``task.datasets`` selects)."""
    from kvbench.lmeval.runner import build_datasets

    return build_datasets(task_cfg)
