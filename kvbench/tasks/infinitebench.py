"""InfiniteBench: ``task=infinitebench`` -- its 12 tasks (OpenBMB/InfiniteBench at ``88b3daa``, ``src/``; data
``xinrongzhang2022/InfiniteBench``, one ``<task>.jsonl`` per task).

Official pipeline (``src/eval_utils.py`` ``create_prompt`` / ``get_answer``, ``src/eval_yarn_mistral.py``) and who does
what
-------------------------------------------------------------------------------------------------------------------
1. Prompt: the model family's template (``src/prompt.py``) formatted per task as ``create_prompt`` does (``code_run``
   finds ``func_N(x)`` in the input, ``math_find`` builds "What is <the largest number> in the following list?"
   from it, the choice tasks fill ``OPTION_A`` .. ``OPTION_D``) -- here (:func:`format_prompt`); the ``context`` is
   the template up to and including its ``{context}``, the ``question`` the rest.  Templates: ``yarn-mistral``
   (``yarn_mistral_templates``, the one every open model in the official repository uses: Yarn-Mistral, Yi-6B/34B-200K,
   ChatGLM3), ``gpt4`` and ``claude2``; ``task.options.template=auto`` (default, :func:`auto_template`) reads the
   model preset's path: an official open model (a Mistral, Yi-200K, ChatGLM3) gets its official template, any other
   model the documented fallback, the same ``yarn-mistral`` (recorded as ``template_rule``; kimi's templates are for its
   file API and are not offered).
2. Truncation: the prompt is tokenised with special tokens; longer than the limit (the official ``TRUNCATE_LEN`` is
   128K, ``model.max_input_length`` here), the ids ``[:n // 2] + [-(n // 2):]`` are decoded once with
   ``skip_special_tokens=True`` -- the runner, truncation mode ``middle_joined_half``.
3. No chat template: the official open-model scripts feed the raw text (``task.options.chat_template=true`` wraps it in
   the model's template: a named deviation).  Greedy generation of ``DATA_NAME_TO_MAX_NEW_TOKENS[task]`` tokens, stop
   at EOS -- the runner.
4. Scoring (:mod:`kvbench.metrics.infinitebench`): ``compute_scores.py``'s per-task scorer on the label ``get_answer``
   returns, mean x100.

Data: ``task.data_dir`` (a folder of the official ``<task>.jsonl`` files, what ``scripts/prepare_data.py
infinitebench`` writes with a sha256-verified ``MANIFEST.json``), ``fixtures`` (our tiny stand-ins in the official
schema), or null: ``./data/infinitebench`` when present, else the hub.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvbench import resources
from kvbench.checks import check_choice, check_known_keys
from kvbench.metrics.infinitebench import task_score
from kvbench.tasks import provenance
from kvbench.tasks.base import PackageNeed, Sample, TaskDataset, register_data_preparer, register_task, select_datasets

INFINITEBENCH_DIR = resources.tasks_dir() / "infinitebench"
FIXTURES_DIR = INFINITEBENCH_DIR / "fixtures"
DEFAULT_DATA_DIR = Path("data") / "infinitebench"
DEFAULT_HUB_REPO = "xinrongzhang2022/InfiniteBench"
DEFAULT_HUB_REVISION = "main"
TEMPLATES = ("auto", "yarn-mistral", "gpt4", "claude2")
#: ``MODEL_TO_PROMPT_TEMPLATE``'s open models, matched in the model preset's path (the tokenizer's ``name_or_path``).
OFFICIAL_OPEN_MODELS = {
    r"yarn-mistral|mistral": "yarn-mistral",
    r"yi-(6|34)b-200k": "yi-6b/34b-200k",
    r"chatglm3": "chatglm3",
}
VALID_OPTIONS: dict[str, Any] = {
    "template": "auto",
    "chat_template": False,
    "fixed_kv_label": False,
    "hub_repo": DEFAULT_HUB_REPO,
    "hub_revision": DEFAULT_HUB_REVISION,
    # null = the official DATA_NAME_TO_MAX_NEW_TOKENS (math_calc: 30000); an integer caps every task (recorded).
    "max_new_tokens": None,
}
#: What each task's ``compute_scores.py`` scorer measures (the others: exact-match accuracy).
METRIC_NAMES = {
    "longbook_qa_eng": "qa_f1_score",
    "longbook_qa_chn": "qa_f1_score_zh",
    "longbook_sum_eng": "rougeLsum",
    "math_calc": "leading_values_fraction",
}
_HOW_TO_GET = "python scripts/prepare_data.py infinitebench (writes data/infinitebench, read by default)"


@lru_cache(maxsize=1)
def settings() -> dict[str, Any]:
    """``tasks/infinitebench/prompts.json``: the official templates per family and generation limits."""
    return json.loads((INFINITEBENCH_DIR / "prompts.json").read_text(encoding="utf-8"))


def task_names() -> list[str]:
    """The 12 tasks, in the official ``ALL_TASKS`` order."""
    return list(settings()["max_new_tokens"])


def _format_fields(task: str, line: dict[str, Any]) -> dict[str, Any]:
    """The ``str.format`` fields ``create_prompt`` passes for ``task``."""
    if task == "code_run":
        call = re.findall(r"func_[0-9]+\(\-?[0-9]+\)", line["input"])[0]
        return {"func": call.split("(")[0], "func_call": call, "context": line["context"]}
    options = {
        f"OPTION_{letter}": option for letter, option in zip("ABCD", (line.get("options") or [])[:4], strict=False)
    }
    if task == "code_debug":
        return {"context": line["context"], **options}
    if task in ("longbook_choice_eng", "longbook_qa_eng", "longbook_qa_chn", "longbook_sum_eng"):
        return {"context": line["context"], "question": line["input"], **options}
    if task == "math_find":
        found = re.findall(r"The .+ of", line["input"])
        if not found:
            raise ValueError(f"math_find: cannot find the target number in {line['input']!r}")
        prefix = f"What is {found[0].lower()[:-3]} in the following list?"
        return {"prefix": prefix, "context": line["context"], "input": line["input"]}
    return {"context": line["context"], "input": line["input"]}


def format_prompt(task: str, line: dict[str, Any], template: str) -> tuple[str, str]:
    """``(context, question)`` whose concatenation is ``create_prompt(line, task, <family>)``: the template split right
    after ``{context}`` (gpt4's ``math_calc`` prompt is the bare context, as ``create_prompt`` returns it)."""
    if template == "gpt4" and task == "math_calc":
        return line["context"], ""
    text = settings()["templates"][template][task]
    fields = _format_fields(task, line)
    cut = text.index("{context}") + len("{context}")
    try:
        return text[:cut].format(**fields), text[cut:].format(**fields)
    except KeyError as err:  # e.g. claude2's longbook_qa_eng names {input}, which create_prompt does not pass
        raise ValueError(
            f"InfiniteBench template {template!r} of {task!r} needs field {err}, which the official create_prompt "
            "does not pass (the official code fails there too); use task.options.template=yarn-mistral"
        ) from err


def official_label(task: str, line: dict[str, Any]) -> Any:
    """``get_answer``: ``[option text, letter]`` for the choice tasks, else the line's ``answer`` as stored."""
    answer = line["answer"]
    if task not in ("code_debug", "longbook_choice_eng"):
        return answer
    if isinstance(answer, str):
        return [answer, "ABCD"[line["options"].index(answer)]]
    if isinstance(answer, list) and len(answer) == 1:
        return [answer[0], "ABCD"[line["options"].index(answer[0])]]
    if isinstance(answer, list) and len(answer) == 2 and answer[1] in ("A", "B", "C", "D"):
        return answer
    raise ValueError(f"{task}: answer {answer!r} is neither an option nor [option, letter]")


def load_task_file(path: Path) -> list[dict[str, Any]]:
    """One official ``<task>.jsonl`` (objects with ``context``, ``input``, ``answer``); errors name ``file:line``."""
    lines = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: invalid JSON ({err.msg}); re-run {_HOW_TO_GET}") from err
        if not (isinstance(obj, dict) and isinstance(obj.get("context"), str) and isinstance(obj.get("input"), str)):
            raise ValueError(f"{path}:{number}: expected an object with string 'context' and 'input'")
        if "answer" not in obj:
            raise ValueError(f"{path}:{number}: field 'answer' is missing")
        lines.append(obj)
    return lines


def auto_template(tokenizer: Any) -> tuple[str, str]:
    """``(template, rule)`` for ``task.options.template=auto``: the official ``MODEL_TO_PROMPT_TEMPLATE`` entry when
    the model preset's path names one of its open models (all use ``yarn_mistral_templates``), else the documented
    fallback, the same template (the one the official code gives every open model)."""
    name = str(getattr(tokenizer, "name_or_path", "") or "").lower()
    for pattern, family in OFFICIAL_OPEN_MODELS.items():
        if re.search(pattern, name):
            return "yarn-mistral", f"official ({family})"
    return "yarn-mistral", "fallback (no official template for this model; the open models' one)"


class InfiniteBenchDataset(TaskDataset):
    """One InfiniteBench task."""

    truncation = "middle_joined_half"

    def __init__(
        self,
        name: str,
        *,
        data_dir: str | None,
        num_samples: int | None,
        options: dict[str, Any],
        tokenizer: Any = None,
    ) -> None:
        self.name = name
        if options["template"] == "auto":
            self.template, self.template_rule = auto_template(tokenizer)
        else:
            self.template, self.template_rule = options["template"], "task.options.template"
        self.chat_template = bool(options["chat_template"])
        self.fixed_kv_label = bool(options["fixed_kv_label"])
        limit = int(settings()["max_new_tokens"][name])
        cap = options["max_new_tokens"]
        self.max_new_tokens = limit if cap is None else min(limit, int(cap))
        self.metric_name = METRIC_NAMES.get(name, "accuracy")
        self.data_dir, self.num_samples = data_dir, num_samples
        self.hub_repo, self.hub_revision = options["hub_repo"], options["hub_revision"]
        self._samples: list[Sample] | None = None
        self._provenance: dict[str, Any] = {}

    def _lines(self) -> list[dict[str, Any]]:
        file_name = f"{self.name}.jsonl"
        data_dir = self.data_dir
        if data_dir is None and DEFAULT_DATA_DIR.is_dir():
            data_dir = str(DEFAULT_DATA_DIR)
        if data_dir is None:
            path, commit = provenance.hub_dataset_file(
                "InfiniteBench", self.hub_repo, file_name, self.hub_revision, _HOW_TO_GET
            )
            self._provenance = {"data": provenance.hub(self.hub_repo, self.hub_revision, commit, {file_name: path})}
            return load_task_file(path)
        folder = FIXTURES_DIR if data_dir == "fixtures" else Path(data_dir).expanduser()
        path = folder / file_name
        if not path.is_file():
            raise FileNotFoundError(f"InfiniteBench file {path} not found; run {_HOW_TO_GET}")
        provenance.verify_prepared(folder, file_name, _HOW_TO_GET)
        stand_in = folder == FIXTURES_DIR
        record = provenance.stand_in(path, file_name, _HOW_TO_GET) if stand_in else provenance.official(path)
        self._provenance = {"data": record}
        return load_task_file(path)

    def samples(self) -> Sequence[Sample]:
        if self._samples is None:
            lines = self._lines()
            if self.num_samples is not None:
                lines = lines[: self.num_samples]
            self._samples = []
            for index, line in enumerate(lines):
                context, question = format_prompt(self.name, line, self.template)
                label = official_label(self.name, line)
                answers = [str(x) for x in label] if isinstance(label, list) else [str(label)]
                sample_id = f"{self.name}-{line.get('id', index)}"
                self._samples.append(Sample(sample_id, context, question, answers, extra={"label": label}))
        return self._samples

    def provenance(self) -> dict[str, dict[str, Any]]:
        self.samples()
        return self._provenance

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        """``compute_scores.py``'s mean for the task, x100 (the template's family is the scorer's ``model_name``)."""
        labels = [sample.extra["label"] for sample in samples]
        keys = [sample.id for sample in samples]
        mean = task_score(self.name, predictions, labels, self.template, keys, fixed_kv_label=self.fixed_kv_label)
        return {"score": 100 * mean}

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            {
                "benchmark": "infinitebench",
                "template": self.template,
                "template_rule": self.template_rule,
                "fixed_kv_label": self.fixed_kv_label,
            }
        )
        return info


def _options(task_cfg: Any) -> dict[str, Any]:
    given = dict(getattr(task_cfg, "options", None) or {})
    check_known_keys(given, VALID_OPTIONS, "task.options", "InfiniteBench")
    merged = {**VALID_OPTIONS, **given}
    check_choice("task.options.template", merged["template"], TEMPLATES)
    cap = merged["max_new_tokens"]
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ValueError(f"task.options.max_new_tokens must be a positive integer or null, got {cap!r}")
    return merged


def required_packages(task: Any) -> list[PackageNeed]:
    """``rouge_score`` when ``longbook_sum_eng`` is selected (its official ROUGE)."""
    names = list(task.datasets) if task.datasets is not None else task_names()
    if "longbook_sum_eng" not in names:
        return []
    return [
        PackageNeed(
            "rouge_score",
            "scoring InfiniteBench longbook_sum_eng (evaluate's rouge)",
            "Install it with `pip install rouge-score`, or leave longbook_sum_eng out of task.datasets.",
        )
    ]


@register_task(
    "infinitebench",
    dataset_names=lambda task: task_names(),
    required_packages=required_packages,
    data_dir_values={"fixtures": "the shipped InfiniteBench stand-in fixtures"},
)
def build_infinitebench(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """One dataset per selected task (tokenizer unused: truncation is the runner's)."""
    options = _options(task_cfg)
    names = select_datasets(
        task_names(), getattr(task_cfg, "datasets", None), getattr(task_cfg, "name", "infinitebench")
    )
    num_samples = getattr(task_cfg, "num_samples", None)
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"task.num_samples must be >= 1 or null, got {num_samples}")
    data_dir = getattr(task_cfg, "data_dir", None)
    return [
        InfiniteBenchDataset(n, data_dir=data_dir, num_samples=num_samples, options=options, tokenizer=tokenizer)
        for n in names
    ]


@register_data_preparer("infinitebench")
def prepare_infinitebench(
    target_dir: Path, hub_repo: str = DEFAULT_HUB_REPO, hub_revision: str = DEFAULT_HUB_REVISION
) -> None:
    """Download the 12 ``<task>.jsonl`` files into ``target_dir`` (each checked to parse) and write ``MANIFEST.json``
    with their sha256; every later read verifies it."""
    target_dir = Path(target_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    commit = None
    for name in task_names():
        source, commit = provenance.hub_dataset_file(
            "InfiniteBench", hub_repo, f"{name}.jsonl", hub_revision, _HOW_TO_GET
        )
        lines = load_task_file(source)
        target = target_dir / f"{name}.jsonl"
        tmp = target.with_suffix(".jsonl.tmp")
        tmp.write_bytes(source.read_bytes())
        tmp.replace(target)
        counts[target.name] = len(lines)
        print(f"infinitebench: wrote {len(lines)} lines to {target}")
    provenance.write_manifest(
        target_dir, {"hub_repo": hub_repo, "hub_revision": hub_revision, "commit": commit}, counts
    )
