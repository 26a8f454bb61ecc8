"""LongBench v1: ``task=longbench`` (16 English/code datasets), ``task=longbench_full`` (21, with the 5 Chinese
ones), ``task=longbench_e`` (LongBench-E, 13 datasets scored in length buckets).

Specification: ``/work/shared/specs/benchmarks.md`` section 1 (official ``LongBench/pred.py``, ``eval.py``,
``metrics.py``).  Per-dataset settings (official prompt, max new tokens, where the question segment starts) are
declared in ``tasks/longbench/datasets.json``; scoring is :mod:`kvbench.metrics.longbench`.

Official pipeline and who does what
-----------------------------------
1. ``prompt = dataset2prompt[name].format(**line)`` -- here; each :class:`Sample` carries it as
   ``context + question`` (byte-identical to the official formatted prompt).
2. Middle truncation of the *formatted prompt* in tokens (special tokens counted) to the model's maximum input
   length, halves decoded and joined as strings -- the runner, with :func:`truncate_middle` /
   :func:`truncate_prompt` from this module.
3. Chat template after truncation, skipped for trec, triviaqa, samsum, lsht, lcc, repobench-p
   (:attr:`LongBenchDataset.chat_template`) -- the runner.
4. Greedy generation with ``max_new_tokens = dataset2maxlen[name]``; samsum additionally stops on the token id of
   ``"\\n"`` (``tokenizer.encode("\\n", add_special_tokens=False)[-1]``, :attr:`stop_token_texts`) and cannot stop at
   its first step (``min_new_tokens = 1``, the official ``min_length = context_length + 1``: the newline and EOS
   logits are masked there) -- the runner.  As in ``pred.py`` the newline token ends the prediction text.
5. No post-processing of the decoded text (``postprocess`` is the identity, as ``pred.py``); the first-line cut
   for trec/triviaqa/samsum/lsht is part of the official scorer and happens in :meth:`LongBenchDataset.score`.

Question-aware / question-agnostic
----------------------------------
``Sample.context`` is the formatted prompt up to where the question segment starts, ``Sample.question`` the
rest (the question and the answer prefix), following the kvpress/Ada-KV split: e.g. for QA datasets the
question segment is ``"Question: ...\\nAnswer:"``, for gov_report ``"Now, write a one-page summary of the
report.\\n\\nSummary:"``, for few-shot datasets the ``input`` field, for lcc the answer prefix
``"Next line of code:\\n"``.  The split points are the ``question_start`` strings in ``datasets.json``.

Data
----
``task.data_dir`` (offline): a folder with the official jsonl files ``<name>.jsonl`` / ``<name>_e.jsonl``
(the unzipped ``data.zip`` layout, or what ``scripts/prepare_data.py longbench`` writes); a ``data/`` sub-folder
is also searched.  Without ``data_dir``: ``./data/longbench`` when it exists (``scripts/prepare_data.py longbench``
writes there by default), else the Hugging Face hub's Parquet export of ``THUDM/LongBench`` (branch
``refs/convert/parquet``, layout ``<config>/test/0000.parquet``; read with pyarrow, since ``datasets`` rejects the
original loading script and does not resolve that branch's configs).  ``task.options.hub_repo`` may also be a local
folder with that layout.  ``task.data_dir=fixtures`` selects the tiny fixtures shipped in ``tasks/longbench/fixtures``
(our own text, official schema: a stand-in, recorded and warned about).  Every metrics.json records the source: the
file and its sha256, or the hub repo, revision, commit and file hashes.

Options (``task.options``)
--------------------------
``code_sim_backend``: ``difflib`` (default, official) | ``levenshtein`` -- the ``fuzz.ratio`` backend of lcc and
repobench-p, recorded in metrics.json.  ``hub_repo`` (default ``THUDM/LongBench``) and ``hub_revision``
(default ``refs/convert/parquet``) -- where hub data comes from.  ``max_new_tokens`` (default null = official
``dataset2maxlen``): an integer caps every dataset's generation length (a named deviation for quick runs and tests;
recorded in metrics.json's ``dataset_settings``).

Size: just over 500 lines: the official pipeline above (settings, the three data sources with their provenance,
the dataset, the three task kinds, the preparer) reads top to bottom in one file; its scoring already lives in
:mod:`kvbench.metrics.longbench` and its truncation in :mod:`kvbench.prompting`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvbench import resources
from kvbench.checks import check_choice, check_known_keys, json_error_text
from kvbench.config import QUESTION_MODES
from kvbench.metrics.longbench import (
    CODE_SIM_BACKENDS,
    DATASET2METRIC,
    DEFAULT_CODE_SIM_BACKEND,
    FIRST_LINE_DATASETS,
    scorer,
    scorer_e,
)
from kvbench.prompting import BOS_MODES, split_truncated_prompt, truncate_middle, truncate_prompt
from kvbench.tasks import provenance
from kvbench.tasks.base import (
    PackageNeed,
    Sample,
    TaskDataset,
    register_data_preparer,
    register_task,
    select_datasets,
)

__all__ = [
    "CHAT_TEMPLATE_SKIP",
    "DEFAULT_HUB_REPO",
    "DEFAULT_HUB_REVISION",
    "FIXTURES_DIR",
    "LONGBENCH_DIR",
    "VALID_OPTIONS",
    "LongBenchDataset",
    "dataset_names",
    "format_sample",
    "load_jsonl",
    "prepare_longbench",
    "split_truncated_prompt",
    "truncate_middle",
    "truncate_prompt",
]

#: Declarative data of this task (prompts, limits, fixtures): shipped ``tasks/longbench`` (:mod:`kvbench.resources`).
LONGBENCH_DIR = resources.tasks_dir() / "longbench"
#: Our own tiny fixtures in the official jsonl schema (``task.data_dir=fixtures``).
FIXTURES_DIR = LONGBENCH_DIR / "fixtures"
#: Datasets whose prompt is not wrapped in the chat template (official ``pred.py``).
CHAT_TEMPLATE_SKIP: tuple[str, ...] = ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p")
DEFAULT_HUB_REPO = "THUDM/LongBench"
#: The Parquet export branch: one config per dataset (``<name>``, ``<name>_e``), split ``test``.
DEFAULT_HUB_REVISION = "refs/convert/parquet"
#: Accepted ``task.options`` keys and their defaults.
VALID_OPTIONS: dict[str, Any] = {
    "code_sim_backend": DEFAULT_CODE_SIM_BACKEND,
    "hub_repo": DEFAULT_HUB_REPO,
    "hub_revision": DEFAULT_HUB_REVISION,
    # null = the official dataset2maxlen; an integer caps every dataset's generation (named deviation, recorded).
    "max_new_tokens": None,
    # BOS of templated prompts: single (kvbench, THUDM's pred.py has no Llama-3 branch) | reference_double (Ada-KV's
    # and CAKE's pred.py tokenise the templated text with special tokens: two BOS ids); set by their presets.
    "bos": "single",
}
#: Task kinds registered by this module and whether they read LongBench-E files.
TASK_KINDS: dict[str, bool] = {"longbench": False, "longbench_full": False, "longbench_e": True}
_HOW_TO_GET = "python scripts/prepare_data.py longbench (writes data/longbench, read by default)"


# ------------------------------------------------------------------------------------------------------------
# Declarative settings
# ------------------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _settings() -> dict[str, Any]:
    """``tasks/longbench/datasets.json``, validated (each split marker occurs exactly once in its prompt)."""
    path = LONGBENCH_DIR / "datasets.json"
    if not path.is_file():
        raise FileNotFoundError(f"LongBench settings not found at {path} (shipped data missing: reinstall kvbench)")
    settings = json.loads(path.read_text(encoding="utf-8"))
    for name, entry in settings["datasets"].items():
        if entry["prompt"].count(entry["question_start"]) != 1:
            raise ValueError(f"{path}: question_start of {name!r} must occur exactly once in its prompt")
        if name not in DATASET2METRIC:
            raise ValueError(f"{path}: dataset {name!r} has no official metric")
    return settings


def dataset_names(kind: str = "longbench_full") -> list[str]:
    """Dataset names of a task kind (``longbench`` 16, ``longbench_full`` 21, ``longbench_e`` 13), in order."""
    tasks = _settings()["tasks"]
    if kind not in tasks:
        raise ValueError(f"unknown LongBench task kind {kind!r}; valid kinds: {', '.join(tasks)}")
    return list(tasks[kind])


def dataset_settings(name: str) -> dict[str, Any]:
    """The ``datasets.json`` entry of one dataset (prompt, question_start, max_new_tokens, language, category)."""
    datasets = _settings()["datasets"]
    if name not in datasets:
        raise ValueError(f"unknown LongBench dataset {name!r}; valid datasets: {', '.join(datasets)}")
    return dict(datasets[name])


def format_sample(name: str, line: dict[str, Any]) -> tuple[str, str]:
    """``(context, question)`` of one official data line; ``context + question`` equals
    ``dataset2prompt[name].format(**line)`` exactly (only ``{context}`` and ``{input}`` are substituted)."""
    entry = dataset_settings(name)
    prompt, marker = entry["prompt"], entry["question_start"]
    cut = prompt.index(marker)
    fields = {"context": line["context"], "input": line["input"]}
    return prompt[:cut].format(**fields), prompt[cut:].format(**fields)


# ------------------------------------------------------------------------------------------------------------
# Truncation helpers (used by the runner)
# ------------------------------------------------------------------------------------------------------------


# The truncation rule applies to every task; it lives in kvbench.prompting and is re-exported here for users of
# the official LongBench names.


# ------------------------------------------------------------------------------------------------------------
# Data loading
# ------------------------------------------------------------------------------------------------------------


def _check_line(obj: Any, where: str) -> dict[str, Any]:
    """Validate one official data line; errors name ``where`` (``file:line``)."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in ("input", "context"):
        if not isinstance(obj.get(key), str):
            raise ValueError(f"{where}: field {key!r} must be a string")
    answers = obj.get("answers")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise ValueError(f"{where}: field 'answers' must be a non-empty list of strings")
    classes = obj.get("all_classes")
    if classes is not None and not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
        raise ValueError(f"{where}: field 'all_classes' must be a list of strings or null")
    length = obj.get("length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, int)):
        raise ValueError(f"{where}: field 'length' must be an integer")
    if "_id" in obj and not isinstance(obj["_id"], str):
        raise ValueError(f"{where}: field '_id' must be a string")
    return obj


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read an official LongBench jsonl file; a malformed line raises ``ValueError`` naming ``file:line``."""
    lines = []
    with open(path, encoding="utf-8") as handle:
        for lineno, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: invalid JSON ({json_error_text(err)}); fix or remove that line") from err
            lines.append(_check_line(obj, where))
    return lines


#: Where ``scripts/prepare_data.py longbench`` writes by default (read when ``task.data_dir`` is null).
DEFAULT_DATA_DIR = Path("data") / "longbench"


def _resolve_data_dir(data_dir: str | None) -> Path | None:
    """``fixtures`` means the shipped fixtures; a path is a folder; null is ``./data/longbench`` if it exists, else
    ``None`` (the hub)."""
    if data_dir is None:
        return DEFAULT_DATA_DIR if DEFAULT_DATA_DIR.is_dir() else None
    return FIXTURES_DIR if data_dir == "fixtures" else Path(data_dir).expanduser()


def _local_file(data_dir: Path, file_stem: str) -> Path:
    """``<data_dir>/<stem>.jsonl`` or ``<data_dir>/data/<stem>.jsonl`` (unzipped data.zip)."""
    candidates = [data_dir / f"{file_stem}.jsonl", data_dir / "data" / f"{file_stem}.jsonl"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"LongBench file {file_stem}.jsonl not found in {data_dir} (looked at {', '.join(map(str, candidates))}); "
        "run `python scripts/prepare_data.py longbench --out <dir>` on a machine with network access"
    )


def _hub_folder(config: str, repo: str, revision: str | None) -> tuple[Path, str | None]:
    """A local folder with the Parquet branch's layout for ``config`` and the commit it came from: ``repo`` itself
    when it is a local folder, else a download of ``<config>/test/*.parquet`` (huggingface_hub's cache)."""
    local = Path(repo).expanduser()
    if local.is_dir():
        return local, None
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(
            repo_id=repo, repo_type="dataset", revision=revision, allow_patterns=[f"{config}/test/*.parquet"]
        )
    except Exception as err:
        raise RuntimeError(
            f"could not download LongBench config {config!r} from the hub ({repo}@{revision}): "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}. Offline: run "
            f"`python scripts/prepare_data.py longbench` on a machine with network access (it writes "
            f"{DEFAULT_DATA_DIR}/, read by default), or set task.data_dir to a folder of the official jsonl files"
        ) from err
    return Path(folder), Path(folder).name


def read_parquet_config(folder: Path, config: str) -> tuple[list[dict[str, Any]], list[Path]]:
    """Rows of ``<folder>/<config>/test/*.parquet`` (the hub's Parquet export layout), in shard order."""
    files = sorted((folder / config / "test").glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"LongBench config {config!r}: no {folder / config / 'test'}/*.parquet")
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ImportError("reading LongBench's hub Parquet files needs pyarrow: pip install -e '.[data]'") from err
    rows: list[dict[str, Any]] = []
    for path in files:
        rows.extend(pq.read_table(path).to_pylist())
    return rows, files


def _hub_lines(config: str, repo: str, revision: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One config (``qasper`` / ``qasper_e``) of the hub's Parquet export, split ``test``, as official-schema dicts,
    and its provenance record."""
    folder, commit = _hub_folder(config, repo, revision)
    rows, files = read_parquet_config(folder, config)
    lines = [_check_line(row, f"{repo}@{revision}:{config}[{index}]") for index, row in enumerate(rows)]
    record = {
        "source": "hub",
        "repo": repo,
        "revision": revision,
        "commit": commit,
        "files": {str(path.relative_to(folder)): provenance.file_sha256(path) for path in files},
    }
    return lines, record


def _samples_from_lines(name: str, lines: Sequence[dict[str, Any]], limit: int | None) -> list[Sample]:
    """Build samples (ids from ``_id``, made unique if the file repeats one)."""
    samples = []
    seen: dict[str, int] = {}
    for index, line in enumerate(lines[:limit] if limit is not None else lines):
        context, question = format_sample(name, line)
        base_id = line.get("_id") or f"{name}-{index}"
        seen[base_id] = seen.get(base_id, 0) + 1
        sample_id = base_id if seen[base_id] == 1 else f"{base_id}#{seen[base_id]}"
        samples.append(
            Sample(
                id=sample_id,
                context=context,
                question=question,
                answers=list(line["answers"]),
                all_classes=list(line["all_classes"]) if line.get("all_classes") is not None else None,
                length=line.get("length"),
                extra={"_id": line.get("_id"), "index": index, "language": line.get("language")},
            )
        )
    return samples


# ------------------------------------------------------------------------------------------------------------
# The dataset
# ------------------------------------------------------------------------------------------------------------


class LongBenchDataset(TaskDataset):
    """One LongBench dataset: official prompt, limits and scorer.

    Samples are loaded lazily on the first :meth:`samples` call, from ``data_dir`` when given, else the hub.
    """

    def __init__(
        self,
        name: str,
        *,
        longbench_e: bool = False,
        data_dir: str | None = None,
        num_samples: int | None = None,
        question_mode: str = "aware",
        code_sim_backend: str = DEFAULT_CODE_SIM_BACKEND,
        hub_repo: str = DEFAULT_HUB_REPO,
        hub_revision: str | None = DEFAULT_HUB_REVISION,
        bos: str = "single",
    ) -> None:
        entry = dataset_settings(name)
        self.bos = check_choice("task.options.bos", bos, BOS_MODES)
        if longbench_e and name not in dataset_names("longbench_e"):
            raise ValueError(f"{name!r} is not in LongBench-E; valid: {', '.join(dataset_names('longbench_e'))}")
        check_choice("task.options.code_sim_backend", code_sim_backend, CODE_SIM_BACKENDS)
        check_choice("task.question_mode", question_mode, QUESTION_MODES)
        self.name = name
        self.max_new_tokens = int(entry["max_new_tokens"])
        self.chat_template = name not in CHAT_TEMPLATE_SKIP
        self.truncation = "middle"
        #: samsum: pred.py adds the newline's token id to the eos ids ...
        self.stop_token_texts = ("\n",) if name == "samsum" else ()
        #: ... and sets ``min_length = context_length + 1`` (neither eos nor newline at the first step); 0 elsewhere.
        self.min_new_tokens = 1 if name == "samsum" else 0
        self.metric_name = DATASET2METRIC[name].__name__
        self.language = entry["language"]
        self.category = entry["category"]
        self.longbench_e = longbench_e
        self.data_dir = data_dir
        self.num_samples = num_samples
        self.question_mode = question_mode
        self.code_sim_backend = code_sim_backend
        self.hub_repo = hub_repo
        self.hub_revision = hub_revision
        self._samples: list[Sample] | None = None
        self._provenance: dict[str, Any] | None = None

    @property
    def file_stem(self) -> str:
        """Official file/config name: ``<name>`` or ``<name>_e``."""
        return f"{self.name}_e" if self.longbench_e else self.name

    def samples(self) -> Sequence[Sample]:
        """The first ``num_samples`` samples of the official file, in file order."""
        if self._samples is None:
            folder = _resolve_data_dir(self.data_dir)
            if folder is not None:
                path = _local_file(folder, self.file_stem)
                if folder != FIXTURES_DIR:
                    provenance.verify_prepared(path.parent, path.name, _HOW_TO_GET)
                lines = load_jsonl(path)
                if folder == FIXTURES_DIR:
                    record = provenance.stand_in(path, f"{self.file_stem}.jsonl", _HOW_TO_GET)
                else:
                    record = provenance.official(path)
            else:
                lines, record = _hub_lines(self.file_stem, self.hub_repo, self.hub_revision)
            self._samples = _samples_from_lines(self.name, lines, self.num_samples)
            self._provenance = {"data": record}
        return self._samples

    def provenance(self) -> dict[str, dict[str, Any]]:
        self.samples()
        assert self._provenance is not None
        return self._provenance

    def postprocess(self, prediction: str) -> str:
        """Unchanged, as the official ``pred.py`` stores it (the first-line cut belongs to the scorer)."""
        return prediction

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        """Official scorer (``eval.py``).  LongBench-E also returns the "0-4k"/"4-8k"/"8k+" buckets (NaN when
        empty); its headline ``score`` is the plain scorer over all samples."""
        if len(predictions) != len(samples):
            raise ValueError(f"{len(predictions)} predictions for {len(samples)} samples in {self.name!r}")
        answers = [sample.answers for sample in samples]
        # eval.py passes the all_classes of the file's last line to every sample.
        all_classes = samples[-1].all_classes if samples else None
        result = {"score": scorer(self.name, predictions, answers, all_classes, code_sim_backend=self.code_sim_backend)}
        if self.longbench_e:
            lengths = []
            for sample in samples:
                if sample.length is None:
                    raise ValueError(f"LongBench-E sample {sample.id!r} of {self.name!r} has no 'length'")
                lengths.append(sample.length)
            buckets = scorer_e(
                self.name, predictions, answers, lengths, all_classes, code_sim_backend=self.code_sim_backend
            )
            result.update(buckets)
        return result

    def describe(self) -> dict[str, Any]:
        """Settings recorded in metrics.json (adds the code-sim backend, data source and official rules)."""
        info = super().describe()
        info.update(
            {
                "benchmark": "longbench_e" if self.longbench_e else "longbench",
                "language": self.language,
                "category": self.category,
                "question_mode": self.question_mode,
                "min_new_tokens": self.min_new_tokens,
                "first_line_scoring": self.name in FIRST_LINE_DATASETS,
                "truncation": "middle",
                "code_sim_backend": self.code_sim_backend,
            }
        )
        return info


def _options(task_cfg: Any) -> dict[str, Any]:
    """``task.options`` merged over the defaults; unknown keys or values raise with the valid ones."""
    given = dict(getattr(task_cfg, "options", None) or {})
    check_known_keys(given, VALID_OPTIONS, "task.options", "LongBench")
    merged = {**VALID_OPTIONS, **given}
    cap = merged["max_new_tokens"]
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ValueError(f"task.options.max_new_tokens must be a positive integer or null, got {cap!r}")
    check_choice("task.options.code_sim_backend", merged["code_sim_backend"], CODE_SIM_BACKENDS)
    check_choice("task.options.bos", merged["bos"], BOS_MODES)
    return merged


def _build(kind: str, task_cfg: Any) -> list[TaskDataset]:
    options = _options(task_cfg)
    names = select_datasets(dataset_names(kind), getattr(task_cfg, "datasets", None), getattr(task_cfg, "name", kind))
    num_samples = getattr(task_cfg, "num_samples", None)
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"task.num_samples must be >= 1 or null, got {num_samples}")
    datasets = [
        LongBenchDataset(
            name,
            longbench_e=TASK_KINDS[kind],
            data_dir=getattr(task_cfg, "data_dir", None),
            num_samples=num_samples,
            question_mode=getattr(task_cfg, "question_mode", "aware"),
            code_sim_backend=options["code_sim_backend"],
            hub_repo=options["hub_repo"],
            hub_revision=options["hub_revision"],
            bos=options["bos"],
        )
        for name in names
    ]
    if options["max_new_tokens"] is not None:
        for dataset in datasets:
            dataset.max_new_tokens = min(dataset.max_new_tokens, int(options["max_new_tokens"]))
    return datasets


def _dataset_names(task: Any) -> list[str]:
    """The datasets a LongBench task config runs before building (:data:`~kvbench.tasks.base.DatasetNames`)."""
    return dataset_names(task["kind"])


def required_packages(task: Any) -> list[PackageNeed]:
    """The optional packages a LongBench task config needs (:data:`~kvbench.tasks.base.RequiredPackages`):
    ``datasets`` without ``task.data_dir`` (the hub), ``rapidfuzz`` or ``Levenshtein`` for
    ``task.options.code_sim_backend=levenshtein``, ``jieba`` when a selected dataset is Chinese."""
    needs: list[PackageNeed] = []
    if task.data_dir is None:
        needs.append(
            PackageNeed(
                "datasets",
                f"task={task.name} without task.data_dir (LongBench from the Hugging Face hub)",
                "Install it with `pip install kvbench[data]`, or set task.data_dir to a folder of the official "
                "jsonl files (scripts/prepare_data.py longbench), or task.data_dir=fixtures for the shipped "
                "fixtures.",
            )
        )
    if (task.options or {}).get("code_sim_backend") == "levenshtein":
        needs.append(
            PackageNeed(
                "rapidfuzz|Levenshtein",
                "task.options.code_sim_backend=levenshtein",
                "Install it with `pip install kvbench[levenshtein]`, or use the official "
                "task.options.code_sim_backend=difflib.",
            )
        )
    if _chinese_selected(task):
        needs.append(
            PackageNeed(
                "jieba",
                "scoring the Chinese LongBench datasets",
                "Install it with `pip install jieba==0.42.1`, or select English datasets with task.datasets=[...].",
            )
        )
    return needs


def _chinese_selected(task: Any) -> bool:
    """Whether the selected LongBench datasets include a Chinese one (scored with jieba)."""
    try:
        settings = _settings()
        names = list(task.datasets) if task.datasets is not None else settings["tasks"][task.kind]
        return any(settings["datasets"].get(name, {}).get("language") == "zh" for name in names)
    except (OSError, KeyError, ValueError):  # unreadable settings: the task builder reports it
        return False


#: What the three LongBench kinds tell validation and ``kvbench list tasks`` about themselves.
_DESCRIBED: dict[str, Any] = {
    "dataset_names": _dataset_names,
    "required_packages": required_packages,
    "data_dir_values": {"fixtures": "the shipped LongBench fixtures"},
    "preparer": "longbench",
}


@register_task("longbench", **_DESCRIBED)
def build_longbench(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """The 16 English and code datasets of SnapKV/PyramidKV/Ada-KV/CAKE (tokenizer unused)."""
    return _build("longbench", task_cfg)


@register_task("longbench_full", **_DESCRIBED)
def build_longbench_full(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """All 21 datasets, including the 5 Chinese ones (tokenizer unused)."""
    return _build("longbench_full", task_cfg)


@register_task("longbench_e", **_DESCRIBED)
def build_longbench_e(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """LongBench-E: 13 datasets from the ``<name>_e`` files, scored overall and per length bucket."""
    return _build("longbench_e", task_cfg)


# ------------------------------------------------------------------------------------------------------------
# Offline preparation (scripts/prepare_data.py)
# ------------------------------------------------------------------------------------------------------------

_FIELDS = ("input", "context", "answers", "length", "dataset", "language", "all_classes", "_id")


@register_data_preparer("longbench")
def prepare_longbench(
    target_dir: Path,
    hub_repo: str = DEFAULT_HUB_REPO,
    hub_revision: str | None = DEFAULT_HUB_REVISION,
    include_e: bool = True,
    datasets: Sequence[str] | None = None,
) -> None:
    """Download all 21 datasets (and the 13 LongBench-E ones) from the hub and write the official jsonl files
    ``<name>.jsonl`` / ``<name>_e.jsonl`` plus ``MANIFEST.json`` into ``target_dir``; point
    ``task.data_dir`` at it on offline nodes."""
    target_dir = Path(target_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    names = list(datasets) if datasets is not None else dataset_names("longbench_full")
    unknown = [n for n in names if n not in dataset_names("longbench_full")]
    if unknown:
        raise ValueError(f"unknown dataset(s) {unknown}; valid: {', '.join(dataset_names('longbench_full'))}")
    stems = list(names)
    if include_e:
        stems += [f"{n}_e" for n in dataset_names("longbench_e") if n in names]
    origin: dict[str, Any] = {"hub_repo": hub_repo, "hub_revision": hub_revision}
    counts: dict[str, int] = {}
    for stem in stems:
        lines, record = _hub_lines(stem, hub_repo, hub_revision)
        origin.setdefault("commit", record["commit"])
        path = target_dir / f"{stem}.jsonl"
        tmp = path.with_suffix(".jsonl.tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            for line in lines:
                record = {key: line.get(key) for key in _FIELDS}
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        tmp.replace(path)
        counts[path.name] = len(lines)
        print(f"longbench: wrote {len(lines)} lines to {path}")
    provenance.write_manifest(target_dir, origin, counts)  # every file's sha256, checked on every read
