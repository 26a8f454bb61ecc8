"""``python run.py task=lmeval task.lm_eval_tasks=[arc_easy,...]``: lm-eval tasks in kvbench's runs.

The runner (:class:`kvbench.run.runner.Runner`) does everything it does for any task -- validation, the run folder and
its lock, ``config.yaml`` / ``run_meta.json``, skipping datasets whose ``metrics.json`` holds this config, SIGTERM
handling, the score table, W&B -- and hands each lm-eval task to :meth:`LMEvalDataset.evaluate`, which runs
lm-eval's ``simple_evaluate`` on that task with :class:`~kvbench.lmeval.model.KVBenchLM` around the loaded model,
method and budget, and writes into ``<run folder>/<lm-eval task>/``:

* ``metrics.json`` -- kvbench's schema (``score`` is the headline metric, x 100 for accuracies), every number
  lm-eval reports for the task under ``scores`` (``acc,none``, ``acc_stderr,none``, ``acc_norm,none``, ...), the
  kept-cache summary over the compressed contexts, the task's lm-eval config and the data's provenance;
* ``predictions.jsonl`` -- lm-eval's per-document samples (responses, filtered responses, per-document metrics);
* ``cache_records.jsonl`` -- one row per compressed context (kept sizes, fingerprints, prefill time);
* ``lm_eval_requests*.db`` -- lm-eval's request cache, so an interrupted task resumes without recomputing the
  requests already answered.

``task.options``: ``include_path`` (folder(s) of extra task YAMLs), ``include_defaults`` (lm-eval's own tasks,
default true), ``num_fewshot`` (null: the task's), ``metric`` (headline metric; null: the task's first),
``bootstrap_iters`` (lm-eval's standard errors; 100000 as lm-eval), ``max_length`` (input window; null: as lm-eval's
``hf``).  ``task.num_samples`` is lm-eval's ``limit`` (the first N documents).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from omegaconf import OmegaConf

from kvbench.errors import KVBenchError
from kvbench.lmeval import LM_EVAL_VERSION, require_lm_eval
from kvbench.lmeval.tasks import dataset_label, load_tasks, task_manager
from kvbench.run.job import DatasetJob
from kvbench.storage.writers import PREDICTIONS_FILE, atomic_write_text
from kvbench.tasks.base import Sample, TaskDataset, select_datasets

#: ``task.options`` keys and their defaults.
OPTIONS = {
    "include_path": None,
    "include_defaults": True,
    "num_fewshot": None,
    "metric": None,
    "bootstrap_iters": 100000,
    "max_length": None,
}
#: Metrics on a 0-1 scale that ``score`` reports in percent (others as lm-eval reports them).
PERCENT_METRICS = ("acc", "acc_norm", "acc_mutual_info", "exact_match", "em", "f1", "mcc")
RECORDS_FILE = "cache_records.jsonl"
#: How continuations are scored, recorded in ``metrics.json``'s settings.
LOGLIKELIHOOD_PROTOCOL = "compress once per context, each continuation on a copy (kvbench.lmeval.loglikelihood)"
#: ``dataset_path`` values that read local files (``dataset_kwargs.data_files``) instead of a hub dataset.
LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow")


def task_options(task_cfg: Any) -> dict[str, Any]:
    """``task.options`` with defaults; unknown keys are refused, naming the valid ones."""
    given = OmegaConf.to_container(task_cfg.options, resolve=True) if task_cfg.options else {}
    assert isinstance(given, dict)
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise KVBenchError(f"task.options {unknown} unknown for task kind lmeval; valid: {', '.join(OPTIONS)}")
    return {**OPTIONS, **given}


def build_datasets(task_cfg: Any) -> list[TaskDataset]:
    """One :class:`LMEvalDataset` per leaf task of ``task.lm_eval_tasks`` (``task.datasets``: a subset)."""
    require_lm_eval("task=lmeval")
    names = list(task_cfg.get("lm_eval_tasks") or [])
    if not names:
        raise KVBenchError(
            "task.lm_eval_tasks is empty; name lm-eval tasks, e.g. "
            "task.lm_eval_tasks=[arc_easy,openbookqa,wic,winogrande]"
        )
    options = task_options(task_cfg)
    manager = task_manager(options["include_path"], bool(options["include_defaults"]))
    tasks = load_tasks(manager, names)
    selected = select_datasets(list(tasks), task_cfg.datasets, str(task_cfg.name))
    return [LMEvalDataset(name, tasks[name], manager, options) for name in selected]


class LMEvalDataset(TaskDataset):
    """One lm-eval task as a kvbench dataset that runs its own evaluation loop (:meth:`evaluate`)."""

    max_new_tokens = 0
    truncation = "none"
    evaluates_itself = True

    def __init__(self, name: str, task: Any, manager: Any, options: dict[str, Any]) -> None:
        self.name = name
        self.task = task
        self.manager = manager
        self.options = options
        self.metric_name = str(options["metric"] or _first_metric(task))
        self.source = f"lm-eval task {name} ({dataset_label(manager, name)})"

    def samples(self) -> Sequence[Sample]:
        """The evaluation documents, in lm-eval's order (ids = lm-eval's ``doc_id``); read before the model loads,
        so a missing dataset fails first.  ``task.num_samples`` keeps the first N, as lm-eval's ``limit``."""
        samples = []
        for index, doc in enumerate(self.task.eval_docs):
            text = self.task.doc_to_text(doc)
            samples.append(Sample(id=str(index), context=str(text) if text != "" else f"doc {index}", question="",
                                  answers=[str(self.task.doc_to_target(doc))]))  # fmt: skip
        return samples

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        raise NotImplementedError("lm-eval tasks are scored by lm-eval (LMEvalDataset.evaluate)")

    def provenance(self) -> dict[str, dict[str, Any]]:
        config = self.task.config
        return {
            self.name: {
                "source": "local" if getattr(config, "dataset_path", None) in LOCAL_BUILDERS else "hub",
                "dataset_path": getattr(config, "dataset_path", None),
                "dataset_name": getattr(config, "dataset_name", None),
                "dataset_kwargs": _jsonable(getattr(config, "dataset_kwargs", None)),
                "revision": (getattr(config, "dataset_kwargs", None) or {}).get("revision"),
                "lm_eval_version": _lm_eval_version(),
            }
        }

    def describe(self) -> dict[str, Any]:
        return {"lm_eval_config": _jsonable(self.task.dump_config()), "metric": self.metric_name, **self.options}

    def evaluate(self, job: DatasetJob, loaded: Any, samples: Sequence[Sample]) -> Any:
        """Run lm-eval on this task with the run's method and budget (``job``, a :class:`~kvbench.run.job.DatasetJob`)
        on the ``loaded`` model; write the dataset's files and return its
        :class:`~kvbench.run.records.DatasetResult`."""
        import lm_eval

        from kvbench.lmeval.model import KVBenchLM
        from kvbench.run.records import DatasetResult, cache_summary, metrics_record, settings_record, write_metrics

        cfg = job.cfg
        folder = job.run_folder / self.name
        folder.mkdir(parents=True, exist_ok=True)
        lm = KVBenchLM.from_loaded(
            loaded.model,
            loaded.tokenizer,
            job.method,
            job.budget,
            question_mode=str(cfg.task.question_mode),
            prefill_chunk=cfg.run.prefill_chunk,
            decode_batch=cfg.run.decode_batch,
            max_length=self.options["max_length"],
        )
        lm.model_name = str(cfg.model.name)
        # What spans the task (XKV's sampled mode: its calibration over the compressed contexts, in order) lives in
        # one object per task; a resumed task's cached requests are not replayed (their contexts are not compressed
        # again).
        lm.dataset_state = job.method.layer_allocator.new_dataset_state(self.name, len(samples))
        limit = len(samples) if cfg.task.num_samples is not None else None
        output = lm_eval.simple_evaluate(
            model=lm,
            tasks=[self.task],
            task_manager=self.manager,
            num_fewshot=self.options["num_fewshot"],
            limit=limit,
            bootstrap_iters=int(self.options["bootstrap_iters"]),
            use_cache=str(folder / "lm_eval_requests"),
            log_samples=True,
            random_seed=int(cfg.seed),
        )
        assert output is not None
        numbers = {key: _number(value) for key, value in output["results"][self.name].items() if key != "alias"}
        numbers = {key: value for key, value in numbers.items() if value is not None}
        headline = _headline_key(numbers, self.metric_name)
        value = numbers[headline]
        score = 100 * value if headline.split(",")[0] in PERCENT_METRICS else value
        rows = [_sample_row(row) for row in output["samples"][self.name]]
        records = lm.records
        compressed = [r for r in records if r["cache"]["achieved_per_layer"]]  # one-token contexts compress nothing
        metrics = metrics_record(
            cfg,
            job.cfg_hash,
            self,
            score=score,
            scores=numbers,
            n_samples=len(rows),
            provenance=self.provenance(),
            cache={**cache_summary(compressed), "contexts": len(records)},
            settings=settings_record(cfg, job.method, extra={"loglikelihood_protocol": LOGLIKELIHOOD_PROTOCOL}),
            timing=_timing(records),
            record_extent=False,
            lm_eval={
                "version": _lm_eval_version(),
                "n_shot": _jsonable(output.get("n-shot", {}).get(self.name)),
                "higher_is_better": _jsonable(output.get("higher_is_better", {}).get(self.name)),
                "headline": headline,
            },
        )

        def write_files() -> None:
            atomic_write_text(folder / PREDICTIONS_FILE, "".join(json.dumps(r, default=str) + "\n" for r in rows))
            atomic_write_text(folder / RECORDS_FILE, "".join(json.dumps(r) + "\n" for r in records))

        write_metrics(folder, metrics, write_files)
        kept = metrics["cache"].get("mean_kept_fraction", 1.0)
        return DatasetResult(self.name, self.metric_name, metrics["score"], len(rows), kept, skipped=False)


def _first_metric(task: Any) -> str:
    metrics = getattr(task.config, "metric_list", None) or []
    if metrics:
        return str(metrics[0]["metric"])
    return {"multiple_choice": "acc", "generate_until": "exact_match"}.get(task.OUTPUT_TYPE, "acc")


def _headline_key(numbers: dict[str, float], metric: str) -> str:
    """lm-eval's result key of ``metric`` (``acc,none``; the first filter when there are several)."""
    for key in numbers:
        if key.split(",")[0] == metric and "_stderr" not in key:
            return key
    valid = sorted({key.split(",")[0] for key in numbers if "_stderr" not in key})
    raise KVBenchError(f"task.options.metric={metric!r} is not reported by this task; valid: {', '.join(valid)}")


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None  # "N/A" standard errors, names


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _lm_eval_version() -> str:
    """The installed lm-eval's version (the tested one when its metadata is missing)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return LM_EVAL_VERSION


def _sample_row(sample: dict[str, Any]) -> dict[str, Any]:
    """One ``predictions.jsonl`` row from an lm-eval logged sample (the document itself is left out)."""
    row = {"id": str(sample["doc_id"])}
    row.update({key: value for key, value in sample.items() if key not in ("doc", "arguments")})
    return _jsonable(row)


def _timing(records: list[dict[str, Any]]) -> dict[str, Any]:
    if not records:
        return {}
    prefill = [r["prefill_s"] for r in records]
    return {"prefill_s_mean": sum(prefill) / len(prefill), "prefill_s_total": sum(prefill), "contexts": len(records)}
