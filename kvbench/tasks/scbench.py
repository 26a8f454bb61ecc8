"""SCBench: ``task=scbench`` -- its 12 tasks in multi-turn or multi-request mode (microsoft/MInference ``scbench/`` at
``fb56c91``; data ``microsoft/SCBench``, one config per task), run by the runner's *compress once, ask many* mode
(:mod:`kvbench.run.groups`): every example is a context group, one sample per turn.

Official pipeline (``run_scbench.py`` ``get_pred``, ``eval_utils.py`` ``GreedySearch``) and who does what
-------------------------------------------------------------------------------------------------------
1. Prompts (:mod:`kvbench.tasks.scbench_prompts`): ``create_multiturn_prompt`` (golden context) or
   ``create_scdq_prompt`` (``--same_context_different_query``), with the model's chat template (the official
   scripts pass ``--use_chat_template``; ``task.options.chat_template=false`` gives the raw templates) -- here.
   Examples keep their first ``task.options.max_turns`` turns (``--max_turns``, default 5).
2. Tokens: the first prompt tokenised with special tokens (a chat template that writes its BOS gets a second one,
   as ``tok.encode`` does: ``bos=reference_double``), every later prompt without (``_process_texts``) -- the
   runner (:func:`kvbench.run.groups.encode_group`).
3. KV: the first forward is compressed, later prompts appended, each answer generated and dropped
   (:mod:`kvbench.inference.shared_context`); greedy, ``DATA_NAME_TO_MAX_NEW_TOKENS`` per task (per sub-task for the
   mixed tasks), stop at EOS -- the runner.
4. Scoring (:mod:`kvbench.metrics.scbench`): ``compute_scores`` per turn (multi-turn) or over all queries
   (multi-request), x100; the headline ``score`` is the mean of those numbers (kvbench's aggregate; for the mixed
   tasks the sub-tasks a turn has).

Data: ``task.data_dir`` (a folder of ``<task>.jsonl`` files in the official schema, what ``scripts/prepare_data.py
scbench`` writes with a sha256-verified ``MANIFEST.json``), ``fixtures`` (our tiny stand-ins), or null:
``./data/scbench`` when present, else the hub (``datasets.load_dataset``, as the official script).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvbench.checks import check_choice, check_known_keys
from kvbench.metrics.guard import ScoreGuard
from kvbench.metrics.scbench import FUNCTION_EXTRACTIONS, ScoredRow, official_scores
from kvbench.tasks import provenance
from kvbench.tasks.base import PackageNeed, Sample, TaskDataset, register_data_preparer, register_task, select_datasets
from kvbench.tasks.scbench_prompts import (
    SCBENCH_DIR,
    first_query_start,
    multi_request_prompts,
    multi_turn_prompts,
    official_label,
    templates,
)

LOG = logging.getLogger(__name__)
FIXTURES_DIR = SCBENCH_DIR / "fixtures"
DEFAULT_DATA_DIR = Path("data") / "scbench"
DEFAULT_HUB_REPO = "microsoft/SCBench"
MODES = ("multi_turn", "multi_request")
VALID_OPTIONS: dict[str, Any] = {
    "mode": "multi_turn",
    "chat_template": True,
    "max_turns": 5,
    "repoqa_extraction": "auto",
    "hub_repo": DEFAULT_HUB_REPO,
    "hub_revision": "main",
    "max_new_tokens": None,
    # multi-request scbench_repoqa_and_kv: the official compute_scores scores the kv sub-task's whole rows (always 0);
    # true scores the predictions (kvbench's fix: deviation, recorded).
    "fixed_scdq_kv": False,
}
METRIC_NAMES = {
    "scbench_qa_chn": "qa_f1_score_zh",
    "scbench_summary": "rougeLsum",
    "scbench_vt": "string_match_all",
    "scbench_repoqa": "pass@1 (BLEU >= 0.8)",
}
_REPOQA_TASKS = ("scbench_repoqa", "scbench_repoqa_and_kv")
_HOW_TO_GET = "python scripts/prepare_data.py scbench (writes data/scbench, read by default)"


def task_names() -> list[str]:
    """The 12 tasks, in the official ``run_all_tasks.sh`` order."""
    return list(templates()["tasks"])


def resolve_extraction(setting: str) -> tuple[str, str]:
    """``(extraction, rule)`` for ``task.options.repoqa_extraction``: ``auto`` = ``tree_sitter`` (official) when
    ``tree_sitter_languages`` imports, else ``code_block`` (documented fallback)."""
    if setting != "auto":
        return setting, "task.options.repoqa_extraction"
    try:
        import tree_sitter_languages  # noqa: F401
    except ImportError:
        return "code_block", "fallback (tree_sitter_languages not installed: the first code block, whole)"
    return "tree_sitter", "official (tree_sitter_languages)"


def load_task_file(path: Path) -> list[dict[str, Any]]:
    """One ``<task>.jsonl`` (objects with ``context`` and a non-empty ``multi_turns`` list of ``input`` /
    ``answer``); errors name ``file:line``."""
    examples = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: invalid JSON ({err.msg}); re-run {_HOW_TO_GET}") from err
        turns = obj.get("multi_turns") if isinstance(obj, dict) else None
        if not isinstance(turns, list) or not turns or ("context" not in obj and "input" not in obj):
            raise ValueError(f"{path}:{number}: expected an object with 'context' and a non-empty 'multi_turns' list")
        for index, turn in enumerate(turns):
            if not (isinstance(turn, dict) and isinstance(turn.get("input"), str) and "answer" in turn):
                raise ValueError(f"{path}:{number}: multi_turns[{index}] needs a string 'input' and an 'answer'")
        examples.append(obj)
    return examples


def hub_examples(task: str, repo: str, revision: str) -> list[dict[str, Any]]:
    """``load_dataset(repo, task, split="test")`` as plain dicts (the official loader)."""
    try:
        from datasets import load_dataset

        return [dict(row) for row in load_dataset(repo, task, split="test", revision=revision)]
    except Exception as err:
        raise RuntimeError(
            f"could not load SCBench {task} ({repo}@{revision}): {type(err).__name__}. Offline: run {_HOW_TO_GET} on "
            "a machine with network access, or set task.data_dir"
        ) from err


class SCBenchDataset(TaskDataset):
    """One SCBench task: one context group per example, one sample per turn."""

    truncation = "middle"
    bos = "reference_double"
    chat_template = False  # the prompts are rendered here, with the model's template when options.chat_template

    def __init__(
        self,
        name: str,
        *,
        data_dir: str | None,
        num_samples: int | None,
        options: dict[str, Any],
        tokenizer: Any,
        chat_template: bool,
    ) -> None:
        self.name = name
        self.mode = options["mode"]
        self.context_groups = self.mode
        self.use_chat_template = bool(options["chat_template"]) and chat_template
        self.max_turns = int(options["max_turns"])
        self.tokenizer = tokenizer
        limit = templates()["max_new_tokens"][name]
        cap = options["max_new_tokens"]
        self.turn_limits = limit if isinstance(limit, dict) else None
        self.max_new_tokens = max(limit.values()) if isinstance(limit, dict) else int(limit)
        if cap is not None:
            self.max_new_tokens = min(self.max_new_tokens, int(cap))
        self.cap = cap
        self.extraction, self.extraction_rule = resolve_extraction(options["repoqa_extraction"])
        self.fixed_scdq_kv = bool(options["fixed_scdq_kv"])
        self.metric_name = METRIC_NAMES.get(name, "accuracy")
        self.data_dir, self.num_samples = data_dir, num_samples
        self.hub_repo, self.hub_revision = options["hub_repo"], options["hub_revision"]
        self._samples: list[Sample] | None = None
        self._provenance: dict[str, Any] = {}

    def _examples(self) -> list[dict[str, Any]]:
        file_name = f"{self.name}.jsonl"
        data_dir = self.data_dir
        if data_dir is None and DEFAULT_DATA_DIR.is_dir():
            data_dir = str(DEFAULT_DATA_DIR)
        if data_dir is None:
            self._provenance = {"data": {"source": "hub", "repo": self.hub_repo, "revision": self.hub_revision}}
            return hub_examples(self.name, self.hub_repo, self.hub_revision)
        folder = FIXTURES_DIR if data_dir == "fixtures" else Path(data_dir).expanduser()
        path = folder / file_name
        if not path.is_file():
            raise FileNotFoundError(f"SCBench file {path} not found; run {_HOW_TO_GET}")
        provenance.verify_prepared(folder, file_name, _HOW_TO_GET)
        stand_in = folder == FIXTURES_DIR
        record = provenance.stand_in(path, file_name, _HOW_TO_GET) if stand_in else provenance.official(path)
        self._provenance = {"data": record}
        return load_task_file(path)

    def group_samples(self, index: int, example: dict[str, Any]) -> list[Sample]:
        """One example's turns as samples (see :mod:`kvbench.run.groups`)."""
        turns = example["multi_turns"][: self.max_turns]
        example = {**example, "multi_turns": turns}
        group = f"{self.name}-{example.get('id', index)}"
        if self.mode == "multi_request":
            prompts = multi_request_prompts(self.name, example, self.tokenizer, self.use_chat_template)
            context, questions = prompts[0], prompts[1:]
        else:
            prompts = multi_turn_prompts(self.name, example, self.tokenizer, self.use_chat_template)
            split = first_query_start(self.name, example, prompts[0])
            context, questions = prompts[0][:split], [prompts[0][split:], *prompts[1:]]
        samples = []
        for turn_index, (turn, question) in enumerate(zip(turns, questions, strict=True)):
            label = official_label(self.name, turn)
            extra: dict[str, Any] = {"group": group, "turn": turn_index, "label": label}
            for key in ("lang", "repo"):
                if key in example:
                    extra[key] = example[key]
            if "name" in turn:
                extra["func_name"] = turn["name"]
            if "task" in turn and self.turn_limits is not None:
                extra["subtask"] = turn["task"]
                limit = int(self.turn_limits[turn["task"]])
                extra["max_new_tokens"] = limit if self.cap is None else min(limit, int(self.cap))
            answers = [str(x) for x in label] if isinstance(label, list) else [str(label)]
            samples.append(Sample(f"{group}#t{turn_index}", context, question, answers, extra=extra))
        return samples

    def samples(self) -> Sequence[Sample]:
        if self._samples is None:
            examples = self._examples()
            if self.num_samples is not None:  # examples (context groups), as the official --num_eval_examples
                examples = examples[: self.num_samples]
            self._samples = [s for index, ex in enumerate(examples) for s in self.group_samples(index, ex)]
        return self._samples

    def provenance(self) -> dict[str, dict[str, Any]]:
        self.samples()
        return self._provenance

    def per_turn(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        """``compute_scores``'s numbers for these predictions, x100."""
        rows = [
            ScoredRow(
                turn=int(s.extra["turn"]),
                prediction=p,
                label=s.extra["label"],
                subtask=s.extra.get("subtask"),
                lang=s.extra.get("lang"),
                repo=s.extra.get("repo"),
                func_name=s.extra.get("func_name"),
                key=s.id,
            )
            for p, s in zip(predictions, samples, strict=True)
        ]
        multi_request = self.mode == "multi_request"
        scores = official_scores(self.name, rows, multi_request, self.extraction, self.fixed_scdq_kv, ScoreGuard())
        return {key: 100 * value for key, value in scores.items()}

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        """Per turn (or over all queries) as ``compute_scores``, x100; ``score``: the mean of the numbers of the
        (turn, sub-task) pairs the samples have."""
        numbers = self.per_turn(predictions, samples)
        keys = set()
        for sample in samples:
            key = "all" if self.mode == "multi_request" else f"turn_{sample.extra['turn']}"
            keys.add(f"{key}/{sample.extra['subtask']}" if "subtask" in sample.extra else key)
        headline = [numbers[key] for key in sorted(keys)]
        return {"score": sum(headline) / len(headline), **numbers}

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            {
                "benchmark": "scbench",
                "mode": self.mode,
                "prompt_chat_template": self.use_chat_template,
                "max_turns": self.max_turns,
                "turn_max_new_tokens": self.turn_limits,
            }
        )
        if self.name in _REPOQA_TASKS:
            info.update({"repoqa_extraction": self.extraction, "repoqa_extraction_rule": self.extraction_rule})
        if self.name == "scbench_repoqa_and_kv" and self.mode == "multi_request":
            info["fixed_scdq_kv"] = self.fixed_scdq_kv
        return info


def _options(task_cfg: Any) -> dict[str, Any]:
    given = dict(getattr(task_cfg, "options", None) or {})
    check_known_keys(given, VALID_OPTIONS, "task.options", "SCBench")
    merged = {**VALID_OPTIONS, **given}
    check_choice("task.options.mode", merged["mode"], MODES)
    check_choice("task.options.repoqa_extraction", merged["repoqa_extraction"], ("auto", *FUNCTION_EXTRACTIONS))
    if not isinstance(merged["fixed_scdq_kv"], bool):
        raise ValueError(f"task.options.fixed_scdq_kv must be true or false, got {merged['fixed_scdq_kv']!r}")
    for key in ("max_turns", "max_new_tokens"):
        value = merged[key]
        if (value is not None or key == "max_turns") and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(
                f"task.options.{key} must be a positive integer{' or null' * (key != 'max_turns')}, got {value!r}"
            )
    return merged


def required_packages(task: Any) -> list[PackageNeed]:
    """``rouge_score`` for the summaries; ``nltk`` (and ``tree_sitter_languages`` when asked for) for RepoQA."""
    names = list(task.datasets) if task.datasets is not None else task_names()
    needs = []
    if {"scbench_summary", "scbench_summary_with_needles"} & set(names):
        needs.append(
            PackageNeed(
                "rouge_score",
                "scoring SCBench summaries (evaluate's rouge)",
                "Install it with `pip install rouge-score` (or kvbench[benchmarks]), or leave the summary tasks out.",
            )
        )
    if set(_REPOQA_TASKS) & set(names):
        needs.append(
            PackageNeed(
                "nltk",
                "scoring SCBench RepoQA (BLEU)",
                "Install it with `pip install nltk` (or kvbench[benchmarks]), or leave the repoqa tasks out.",
            )
        )
        extraction = (dict(getattr(task, "options", None) or {})).get("repoqa_extraction", "auto")
        if extraction == "tree_sitter":
            needs.append(
                PackageNeed(
                    "tree_sitter_languages",
                    "task.options.repoqa_extraction=tree_sitter",
                    "pip install tree_sitter==0.21.3 tree_sitter_languages, or task.options.repoqa_extraction=auto",
                )
            )
    return needs


@register_task(
    "scbench",
    dataset_names=lambda task: task_names(),
    required_packages=required_packages,
    data_dir_values={"fixtures": "the shipped SCBench stand-in fixtures"},
)
def build_scbench(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """One dataset per selected task; the prompts are rendered with ``tokenizer``'s chat template when the model
    uses one (``chat_template``) and ``task.options.chat_template`` is on (official)."""
    options = _options(task_cfg)
    names = select_datasets(task_names(), getattr(task_cfg, "datasets", None), getattr(task_cfg, "name", "scbench"))
    num_samples = getattr(task_cfg, "num_samples", None)
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"task.num_samples must be >= 1 or null, got {num_samples}")
    data_dir = getattr(task_cfg, "data_dir", None)
    return [
        SCBenchDataset(
            n,
            data_dir=data_dir,
            num_samples=num_samples,
            options=options,
            tokenizer=tokenizer,
            chat_template=chat_template,
        )
        for n in names
    ]


@register_data_preparer("scbench")
def prepare_scbench(
    target_dir: Path, hub_repo: str = DEFAULT_HUB_REPO, hub_revision: str = "main", loader: Any = None
) -> None:
    """Load the 12 tasks (``datasets.load_dataset(hub_repo, <task>, split="test")``, or ``loader(task)``), write
    ``<task>.jsonl`` (each line checked by :func:`load_task_file`) and ``MANIFEST.json`` with their sha256."""
    target_dir = Path(target_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for name in task_names():
        rows = loader(name) if loader is not None else hub_examples(name, hub_repo, hub_revision)
        target = target_dir / f"{name}.jsonl"
        tmp = target.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
        load_task_file(tmp)
        tmp.replace(target)
        counts[target.name] = len(rows)
        print(f"scbench: wrote {len(rows)} examples to {target}")
    provenance.write_manifest(target_dir, {"hub_repo": hub_repo, "hub_revision": hub_revision}, counts)
