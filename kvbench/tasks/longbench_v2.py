"""LongBench v2: ``task=longbench_v2`` -- 503 long multiple-choice questions (THUDM/LongBench at ``2e00731``, the
repository root's ``pred.py`` and ``result.py``; data ``THUDM/LongBench-v2``, file ``data.json``).

Official pipeline and who does what
-----------------------------------
1. Prompt: the template file (``prompts/0shot.txt``; ``0shot_cot.txt`` for chain of thought, ``0shot_no_context.txt``
   without the document) with ``$DOC$``, ``$Q$``, ``$C_A$`` ... ``$C_D$`` replaced in that order by the stripped
   fields (``str.replace``: every occurrence) -- here, :func:`format_prompt`; templates in
   ``tasks/longbench_v2/prompts.json``.  The sample's ``context`` is the prompt up to ``"What is the correct answer
   to this question:"``, its ``question`` the rest (question-agnostic runs compress the document alone).
2. Truncation: the prompt is tokenised with special tokens; longer than the maximum length, the ids
   ``[:max_len // 2] + [-max_len // 2:]`` are decoded *once* with ``skip_special_tokens=True`` -- the runner,
   truncation mode ``middle_joined`` (:func:`kvbench.prompting.truncate_prompt_joined`).  The maximum is
   ``model.max_input_length`` (``config/model2maxlen.json`` has 120000 for every open model: set
   ``model.max_input_length=120000`` to match it).
3. The text is sent as one user message of the chat API: the model's chat template wraps it -- the runner.
4. Generation: 128 new tokens (1024 for the chain of thought).  The official script samples through an
   OpenAI-compatible server at ``temperature=0.1``; kvbench decodes **greedily** by default (a deterministic score per
   method and budget) and ``task.options.sampling=official`` samples at temperature 0.1, top-p 1, seeded per sample
   (``task.options.seed``).
5. Chain of thought (``task.options.prompt=cot``): the first pass's stripped output is put into
   ``prompts/0shot_cot_ans.txt`` (``$COT$``) and a second pass of 128 tokens answers.  The official answer template
   does **not** contain the document (it says "The text is too long and omitted here."): the second pass is a fresh,
   short prompt, prefilled and compressed by the method like any prompt.  Prediction rows keep the first pass's text
   (``first_pass_text``) and the second pass's record (``later_passes``).
6. Scoring (:mod:`kvbench.metrics.longbench_v2`): ``extract_answer(output.strip())``, ``judge = pred == answer``,
   accuracy overall, easy / hard, short / medium / long.  ``pred.py`` drops a sample whose output is the empty string
   (an API failure to it; the sample is retried on the next run): ``task.options.empty_response=skip`` (default) leaves
   such samples out of every accuracy as ``result.py`` then does, ``wrong`` counts them as wrong answers.

Data
----
``task.data_dir``: a folder with the official ``data.json`` (what ``scripts/prepare_data.py longbench_v2`` writes,
with a ``MANIFEST.json`` whose sha256 is verified on every read); ``fixtures`` selects our tiny stand-ins in
``tasks/longbench_v2/fixtures`` (official schema, our own text); null reads ``./data/longbench_v2`` when it exists,
else downloads ``data.json`` from the hub (``task.options.hub_repo`` / ``hub_revision``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvbench import resources
from kvbench.checks import check_choice, check_known_keys
from kvbench.metrics.longbench_v2 import RESULT_COLUMNS, bucket_accuracies, extract_answer, sample_accuracy
from kvbench.sampling import Sampling
from kvbench.tasks import provenance
from kvbench.tasks.base import Sample, TaskDataset, register_data_preparer, register_task

LONGBENCH_V2_DIR = resources.tasks_dir() / "longbench_v2"
FIXTURES_DIR = LONGBENCH_V2_DIR / "fixtures"
DATA_FILE = "data.json"
DEFAULT_DATA_DIR = Path("data") / "longbench_v2"
DEFAULT_HUB_REPO = "THUDM/LongBench-v2"
DEFAULT_HUB_REVISION = "main"
#: ``task.options.prompt`` -> the official template file (``pred.py``'s ``--cot`` / ``--no_context``).
PROMPTS = {"0shot": "0shot", "cot": "0shot_cot", "no_context": "0shot_no_context"}
SAMPLING_MODES = ("greedy", "official")
EMPTY_RESPONSE_MODES = ("skip", "wrong")
VALID_OPTIONS: dict[str, Any] = {
    "prompt": "0shot",
    "sampling": "greedy",
    "seed": 0,
    "empty_response": "skip",
    "compensated": False,
    "hub_repo": DEFAULT_HUB_REPO,
    "hub_revision": DEFAULT_HUB_REVISION,
    # null = the official limits (128; 1024 for the chain of thought); an integer caps every pass (quick runs).
    "max_new_tokens": None,
}
#: Fields of one official line (``pred.py``'s ``data_all``).
FIELDS = (
    "_id",
    "domain",
    "sub_domain",
    "difficulty",
    "length",
    "question",
    "choice_A",
    "choice_B",
    "choice_C",
    "choice_D",
    "answer",
    "context",
)
_HOW_TO_GET = "python scripts/prepare_data.py longbench_v2 (writes data/longbench_v2, read by default)"


@lru_cache(maxsize=1)
def settings() -> dict[str, Any]:
    """``tasks/longbench_v2/prompts.json``: the official templates, limits and temperature."""
    return json.loads((LONGBENCH_V2_DIR / "prompts.json").read_text(encoding="utf-8"))


def format_prompt(template_name: str, line: dict[str, Any], cot: str | None = None) -> str:
    """``pred.py``'s prompt: the template with ``$DOC$``, ``$Q$``, ``$C_A$``..``$C_D$`` (then ``$COT$``) replaced in
    that order by the stripped fields."""
    return format_prompt_text(settings()["templates"][template_name], line, cot)


def split_prompt(template_name: str, line: dict[str, Any], cot: str | None = None) -> tuple[str, str]:
    """``(context, question)`` with ``context + question == format_prompt(...)``: the question segment starts at
    ``"What is the correct answer to this question:"`` (everything is question without a document)."""
    full = format_prompt(template_name, line, cot)
    template = settings()["templates"][template_name]
    marker = settings()["question_start"]
    suffix = format_prompt_text(template[template.index(marker) :], line, cot)
    if full.endswith(suffix):
        return full[: len(full) - len(suffix)], suffix
    return full, ""  # a field holding a placeholder text: keep the official prompt whole


def format_prompt_text(template: str, line: dict[str, Any], cot: str | None) -> str:
    """:func:`format_prompt` on a template text rather than a template name."""
    text = template.replace("$DOC$", line["context"].strip()).replace("$Q$", line["question"].strip())
    for letter in "ABCD":
        text = text.replace(f"$C_{letter}$", line[f"choice_{letter}"].strip())
    return text if cot is None else text.replace("$COT$", cot)


def check_line(obj: Any, where: str) -> dict[str, Any]:
    """One official line with every field a string and ``answer`` one of A-D; errors name ``where``."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in FIELDS:
        if not isinstance(obj.get(key), str):
            raise ValueError(f"{where}: field {key!r} must be a string")
    if obj["answer"] not in ("A", "B", "C", "D"):
        raise ValueError(f"{where}: field 'answer' must be one of A, B, C, D, got {obj['answer']!r}")
    return {key: obj[key] for key in FIELDS}


def load_data_file(path: Path) -> list[dict[str, Any]]:
    """The official ``data.json`` (a JSON list; a jsonl file is read line by line), validated."""
    text = path.read_text(encoding="utf-8")
    try:
        rows = json.loads(text) if text.lstrip().startswith("[") else [json.loads(x) for x in text.splitlines() if x]
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON ({err.msg} at line {err.lineno}); re-run {_HOW_TO_GET}") from err
    return [check_line(row, f"{path}[{index}]") for index, row in enumerate(rows)]


def load_lines(data_dir: str | None, hub_repo: str, hub_revision: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The official lines and their provenance record (see the module docstring for ``data_dir``)."""
    if data_dir is None and DEFAULT_DATA_DIR.is_dir():
        data_dir = str(DEFAULT_DATA_DIR)
    if data_dir is None:
        path, commit = provenance.hub_dataset_file("LongBench v2", hub_repo, DATA_FILE, hub_revision, _HOW_TO_GET)
        return load_data_file(path), provenance.hub(hub_repo, hub_revision, commit, {DATA_FILE: path})
    folder = FIXTURES_DIR if data_dir == "fixtures" else Path(data_dir).expanduser()
    path = folder / DATA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"LongBench v2 file {path} not found; run {_HOW_TO_GET} (or task.data_dir=fixtures)")
    provenance.verify_prepared(folder, DATA_FILE, _HOW_TO_GET)
    if folder == FIXTURES_DIR:
        return load_data_file(path), provenance.stand_in(path, DATA_FILE, _HOW_TO_GET)
    return load_data_file(path), provenance.official(path)


class LongBenchV2Dataset(TaskDataset):
    """The 503 questions (or the first ``num_samples``) as one dataset, ``longbench_v2``."""

    name = "longbench_v2"
    metric_name = "accuracy"
    truncation = "middle_joined"
    chat_template = True

    def __init__(
        self,
        *,
        data_dir: str | None = None,
        num_samples: int | None = None,
        prompt: str = "0shot",
        sampling: str = "greedy",
        seed: int = 0,
        empty_response: str = "skip",
        compensated: bool = False,
        hub_repo: str = DEFAULT_HUB_REPO,
        hub_revision: str = DEFAULT_HUB_REVISION,
        max_new_tokens: int | None = None,
    ) -> None:
        self.prompt = check_choice("task.options.prompt", prompt, tuple(PROMPTS))
        self.template = PROMPTS[prompt]
        check_choice("task.options.sampling", sampling, SAMPLING_MODES)
        self.empty_response = check_choice("task.options.empty_response", empty_response, EMPTY_RESPONSE_MODES)
        self.compensated = bool(compensated)
        limits = settings()["max_new_tokens"]
        self.max_new_tokens = _capped(limits[self.template], max_new_tokens)
        self.answer_max_new_tokens = _capped(limits["0shot_cot_ans"], max_new_tokens)
        self.multi_pass = prompt == "cot"
        self.sampling = Sampling(float(settings()["temperature"]), 1.0, int(seed)) if sampling == "official" else None
        self.data_dir, self.num_samples = data_dir, num_samples
        self.hub_repo, self.hub_revision = hub_repo, hub_revision
        self._samples: list[Sample] | None = None
        self._provenance: dict[str, Any] | None = None

    def samples(self) -> Sequence[Sample]:
        if self._samples is None:
            lines, record = load_lines(self.data_dir, self.hub_repo, self.hub_revision)
            if self.num_samples is not None:
                lines = lines[: self.num_samples]
            self._samples = [self._sample(line) for line in lines]
            self._provenance = {"data": record}
        return self._samples

    def _sample(self, line: dict[str, Any]) -> Sample:
        context, question = split_prompt(self.template, line)
        extra = {key: line[key] for key in ("difficulty", "length", "domain", "sub_domain")}
        extra["fields"] = {key: line[key] for key in ("question", "choice_A", "choice_B", "choice_C", "choice_D")}
        return Sample(id=line["_id"], context=context, question=question, answers=[line["answer"]], extra=extra)

    def provenance(self) -> dict[str, dict[str, Any]]:
        self.samples()
        assert self._provenance is not None
        return self._provenance

    def follow_up(self, sample: Sample, text: str, passes_done: int) -> tuple[Sample, int] | None:
        """Chain of thought: after the first pass, the answer prompt ``0shot_cot_ans`` with the stripped reasoning
        (none when the reasoning is empty: ``pred.py`` drops such a sample)."""
        if not self.multi_pass or passes_done > 1 or text == "":
            return None
        line = {"context": "", **sample.extra["fields"]}
        context, question = split_prompt("0shot_cot_ans", line, cot=text.strip())
        return Sample(id=f"{sample.id}#answer", context=context, question=question, answers=sample.answers), int(
            self.answer_max_new_tokens
        )

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        """Accuracy (0-100) overall (``score``) and per bucket, plus ``n_scored`` (samples with a non-empty output
        when ``empty_response=skip``)."""
        if len(predictions) != len(samples):
            raise ValueError(f"{len(predictions)} predictions for {len(samples)} samples in {self.name!r}")
        kept = [
            (p, s) for p, s in zip(predictions, samples, strict=True) if not (self.empty_response == "skip" and p == "")
        ]
        accuracies = [sample_accuracy(extract_answer(p.strip()), s.answers[0], self.compensated) for p, s in kept]
        scores = bucket_accuracies(
            accuracies, [s.extra["difficulty"] for _, s in kept], [s.extra["length"] for _, s in kept]
        )
        return {"score": scores.pop("overall"), **scores, "n_scored": float(len(kept))}

    def write_report(self, predictions: Sequence[str], samples: Sequence[Sample], folder: Path, title: str) -> None:
        """``result.tsv``: ``result.py``'s table row for this run (``Model``, ``Overall``, ``Easy``, ``Hard``,
        ``Short``, ``Medium``, ``Long``, each ``round(100 * acc, 1)``; ``nan`` for an empty bucket)."""
        scores = self.score(predictions, samples)
        values = [scores[key] for key in ("score", "easy", "hard", "short", "medium", "long")]
        row = "\t".join([title.replace("\t", " "), *(str(round(value, 1)) for value in values)])
        header = "\t".join(("Model", *RESULT_COLUMNS))
        (Path(folder) / "result.tsv").write_text(f"{header}\n{row}\n", encoding="utf-8")

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            {
                "benchmark": "longbench_v2",
                "prompt": self.prompt,
                "empty_response": self.empty_response,
                "compensated": self.compensated,
                "answer_max_new_tokens": self.answer_max_new_tokens,
            }
        )
        return info


def _capped(limit: int, cap: int | None) -> int:
    return int(limit) if cap is None else min(int(limit), int(cap))


def _options(task_cfg: Any) -> dict[str, Any]:
    given = dict(getattr(task_cfg, "options", None) or {})
    check_known_keys(given, VALID_OPTIONS, "task.options", "LongBench v2")
    merged = {**VALID_OPTIONS, **given}
    cap = merged["max_new_tokens"]
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ValueError(f"task.options.max_new_tokens must be a positive integer or null, got {cap!r}")
    if isinstance(merged["seed"], bool) or not isinstance(merged["seed"], int):
        raise ValueError(f"task.options.seed must be an integer, got {merged['seed']!r}")
    return merged


@register_task(
    "longbench_v2",
    dataset_names=lambda task: ["longbench_v2"],
    data_dir_values={"fixtures": "the shipped LongBench v2 stand-in fixtures"},
)
def build_longbench_v2(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """One dataset, ``longbench_v2`` (tokenizer unused: truncation is the runner's)."""
    options = _options(task_cfg)
    num_samples = getattr(task_cfg, "num_samples", None)
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"task.num_samples must be >= 1 or null, got {num_samples}")
    return [LongBenchV2Dataset(data_dir=getattr(task_cfg, "data_dir", None), num_samples=num_samples, **options)]


@register_data_preparer("longbench_v2")
def prepare_longbench_v2(
    target_dir: Path, hub_repo: str = DEFAULT_HUB_REPO, hub_revision: str = DEFAULT_HUB_REVISION
) -> None:
    """Download ``data.json`` into ``target_dir``, check that it parses, and write ``MANIFEST.json`` (repo, revision,
    commit, sha256, line count); every later read verifies the sha256."""
    target_dir = Path(target_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    path, commit = provenance.hub_dataset_file("LongBench v2", hub_repo, DATA_FILE, hub_revision, _HOW_TO_GET)
    write_prepared(target_dir, path, {"hub_repo": hub_repo, "hub_revision": hub_revision, "commit": commit})


def write_prepared(target_dir: Path, source: Path, origin: dict[str, Any]) -> None:
    """Copy a downloaded ``data.json`` into ``target_dir`` once it parses, then its ``MANIFEST.json``."""
    lines = load_data_file(source)
    tmp = target_dir / f"{DATA_FILE}.tmp"
    shutil.copyfile(source, tmp)
    tmp.replace(target_dir / DATA_FILE)
    provenance.write_manifest(target_dir, origin, {DATA_FILE: len(lines)})
    print(f"longbench_v2: wrote {len(lines)} questions to {target_dir / DATA_FILE}")
