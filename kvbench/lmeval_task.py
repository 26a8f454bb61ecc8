"""``task=lmeval``: lm-evaluation-harness tasks (``task.lm_eval_tasks``), evaluated by :mod:`kvbench.lmeval.runner`.

Registered here, outside both :mod:`kvbench.tasks` and :mod:`kvbench.lmeval` (the task registry finds it by name,
:data:`kvbench.tasks.base.PLUGIN_TASK_MODULES`), so the task kind is known without lm-eval installed or imported
(validation, ``kvbench list``), and the tasks package never imports the lm-eval bridge, which imports it; building
the datasets needs the ``lmeval`` extra and says so when it is missing.
"""

from __future__ import annotations

from typing import Any

from kvbench.tasks.base import TaskDataset, register_task


@register_task("lmeval")
def build_lmeval(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """One dataset per lm-eval task of ``task.lm_eval_tasks`` (groups expanded; ``task.datasets`` selects)."""
    from kvbench.lmeval.runner import build_datasets

    return build_datasets(task_cfg)
