"""Loading lm-eval tasks for kvbench, with clear errors when a task or its data is not there.

lm-eval tasks read their data through ``datasets`` from the Hugging Face hub.  On an offline machine, download them
once where there is network (``python -c "import lm_eval.tasks as t; t.TaskManager().load(['arc_easy'])"``
fills ``$HF_DATASETS_CACHE``), copy the cache, and run with ``HF_DATASETS_OFFLINE=1``; a dataset missing from the
cache then fails here, naming it, before the model loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvbench.errors import KVBenchError
from kvbench.lmeval import require_lm_eval


def task_manager(include_path: str | Sequence[str] | None = None, include_defaults: bool = True) -> Any:
    """lm-eval's :class:`~lm_eval.tasks.TaskManager` over its own tasks (unless ``include_defaults`` is false) and
    the task YAML folders of ``include_path``."""
    paths = [include_path] if isinstance(include_path, str) else list(include_path or [])
    missing = [str(path) for path in paths if not Path(str(path)).expanduser().exists()]
    if missing:  # lm-eval skips a folder it cannot find without a word, then names the task unknown
        raise KVBenchError(
            f"task.options.include_path: {', '.join(missing)} does not exist (a folder of lm-eval task YAMLs, or one "
            "YAML file). Fix the path (relative paths are from the working directory), or drop the option"
        )
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=paths or None, include_defaults=include_defaults)


def dataset_label(manager: Any, name: str) -> str:
    """``dataset_path`` (and ``dataset_name``) of task ``name`` as its YAML states them, for error messages."""
    entry = manager.task_index.get(name)
    cfg = getattr(entry, "cfg", None) or {}
    path, subset = cfg.get("dataset_path"), cfg.get("dataset_name")
    if not path:
        return "its dataset"
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    return f"{path}" + (f" (subset {subset})" if subset else "") + (f" (data_files {files})" if files else "")


def load_tasks(manager: Any, names: Sequence[str]) -> dict[str, Any]:
    """The leaf tasks of ``names`` (groups and tags expanded), by task name, in order.

    Raises :class:`KVBenchError` for an unknown name (with lm-eval's close matches) or a dataset that cannot be
    loaded (offline without it in the cache, or a missing local file), naming the task and the dataset.
    """
    known = set(manager.all_tasks)
    unknown = [name for name in names if name not in known]
    if unknown:
        hints = {name: manager.match_tasks([name]) for name in unknown}
        raise KVBenchError(
            f"unknown lm-eval task(s) {unknown} (close matches: {hints}); list them with `lm_eval ls tasks`, or add "
            "a folder of task YAMLs with task.options.include_path=<folder>"
        )
    tasks: dict[str, Any] = {}
    for name in names:
        try:
            loaded = manager.load([name])
        except (OSError, ValueError, FileNotFoundError) as err:
            raise KVBenchError(
                f"lm-eval task {name!r}: cannot load {dataset_label(manager, name)}: {type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}. Offline machines: download it where there is "
                "network (lm-eval fills $HF_DATASETS_CACHE on first use), copy that cache here and set "
                "HF_DATASETS_OFFLINE=1 (docs/benchmarks/lmeval.md, 'Offline')."
            ) from err
        tasks.update(loaded["tasks"])
    return tasks
