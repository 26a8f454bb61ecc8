"""Long reasoning: ``task=reasoning`` -- GSM8K, MATH500, AIME24 and AIME25 with the Qwen2.5-Math evaluation's prompt and
answer checking (QwenLM/Qwen2.5-Math at ``a45202b``, ``evaluation/``), the evaluation R-KV's decode-time KV papers use.

Official pipeline and who does what
-----------------------------------
1. Question: ``parse_question`` -- the ``question`` field (GSM8K) or ``problem`` (MATH, AIME), stripped, with
   " (True or False)" / " (Yes or No)" appended when the reference answer is one of those words.
2. Prompt: ``construct_prompt`` with ``--prompt_type qwen25-math-cot`` and no shots: the raw template below (the Qwen
   chat markup is part of the template text; no chat template is applied) -- :func:`format_prompt`.
3. Generation: greedy by default (``math_eval.py``'s ``--temperature 0``); ``task.options.sampling=sampled`` draws
   ``task.options.n_samples`` seeded samples per question at ``temperature`` / ``top_p`` (R-KV's paper settings,
   0.6 / 0.95, by default).  Stop strings ``</s>``, ``<|im_end|>``, ``<|endoftext|>``.  ``max_new_tokens`` defaults to
   R-KV's ``run_math.py`` total lengths (GSM8K 8192, MATH 16384, AIME 32768), counted here as new tokens.
4. Reference answer: ``parse_ground_truth`` (MATH: the last ``\\boxed{}`` of ``solution``; GSM8K: after ``####``; AIME:
   ``answer``), normalised by ``strip_string`` -- :func:`kvbench.metrics.math_answer.ground_truth`.
5. Prediction: ``run_execute`` (``extract_answer``, ``strip_string`` twice) and ``math_eval.py``'s A-E clean-up
   (:func:`kvbench.metrics.math_answer.official_prediction`); grading ``math_equal``
   (:mod:`kvbench.metrics.math_grader`;
   ``task.options.grader=math_verify`` uses the ``math-verify`` package on the raw output and the reference as
   written instead).  A grading error scores the sample wrong and is recorded.  Accuracy = mean over every generated
   sample (0-100), with a 95 % interval over questions.

MATH500 and AIME25 are not in Qwen2.5-Math's data folder: MATH500 (``HuggingFaceH4/MATH-500``, MATH's own fields) is
read as its ``math`` data, AIME25 as its ``aime24`` (fields ``problem`` / ``answer``).  See
docs/benchmarks/reasoning.md for every difference.
"""

from __future__ import annotations

import json
import math
import shutil
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvbench import resources
from kvbench.checks import check_choice, check_known_keys
from kvbench.metrics.guard import ScoreGuard
from kvbench.metrics.math_answer import ground_truth, official_prediction, reference_text
from kvbench.metrics.math_grader import math_equal
from kvbench.sampling import Sampling
from kvbench.tasks import provenance
from kvbench.tasks.base import PackageNeed, Sample, TaskDataset, register_data_preparer, register_task

FIXTURES_DIR = resources.tasks_dir() / "reasoning" / "fixtures"
DEFAULT_DATA_DIR = Path("data") / "reasoning"
DATA_FILE = "test.jsonl"
#: ``prompt_type=qwen25-math-cot``'s input template (``evaluation/utils.py``), ``{input}`` the question.
PROMPT_TEMPLATE = (
    "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{{}}.<|im_end|>\n"
    "<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n"
)
STOP_STRINGS = ("</s>", "<|im_end|>", "<|endoftext|>")
#: kvbench dataset -> (the official ``data_name`` whose parsing rules it follows, R-KV's generation length).
DATASETS: dict[str, tuple[str, int]] = {
    "gsm8k": ("gsm8k", 8192),
    "math500": ("math", 16384),
    "aime24": ("aime24", 32768),
    "aime25": ("aime24", 32768),
}
_QWEN_MATH = "https://raw.githubusercontent.com/QwenLM/Qwen2.5-Math/a45202bd16f1ec06f433442dc1152d0074773465"
#: Where ``scripts/prepare_data.py reasoning`` downloads each dataset: a URL, or ``hub:<dataset repo>:<file>``.
SOURCES = {
    "gsm8k": f"{_QWEN_MATH}/evaluation/data/gsm8k/test.jsonl",
    "math500": "hub:HuggingFaceH4/MATH-500:test.jsonl",
    "aime24": f"{_QWEN_MATH}/evaluation/data/aime24/test.jsonl",
    "aime25": "hub:math-ai/aime25:test.jsonl",
}
SAMPLING_MODES = ("greedy", "sampled")
GRADERS = ("official", "math_verify")
VALID_OPTIONS: dict[str, Any] = {
    "sampling": "greedy",
    "temperature": 0.6,
    "top_p": 0.95,
    "n_samples": 1,
    "seed": 0,
    "grader": "official",
    # null = the per-dataset defaults (DATASETS); an integer caps them (quick runs, recorded).
    "max_new_tokens": None,
}
_HOW_TO_GET = "python scripts/prepare_data.py reasoning (writes data/reasoning, read by default)"


def official_question(example: dict[str, Any], data_name: str) -> str:
    """``parse_question``: the first of ``question``/``problem``/``Question``/``input``, with the yes/no hint."""
    question = next((example[key] for key in ("question", "problem", "Question", "input") if key in example), "")
    answer = ground_truth(example, data_name).lower()
    if answer in ("true", "false"):
        question += " (True or False)"
    if answer in ("yes", "no"):
        question += " (Yes or No)"
    return question.strip()


def format_prompt(question: str) -> str:
    """The ``qwen25-math-cot`` zero-shot prompt around ``question``."""
    return PROMPT_TEMPLATE.format(input=question)


def load_examples(path: Path) -> list[dict[str, Any]]:
    """One dataset's jsonl file, each line a JSON object; errors name the file and line."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: invalid JSON ({err.msg}); re-run {_HOW_TO_GET}") from err
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def _dataset_folder(data_dir: str | None, name: str) -> Path:
    if data_dir is None and DEFAULT_DATA_DIR.is_dir():
        data_dir = str(DEFAULT_DATA_DIR)
    if data_dir is None:
        raise FileNotFoundError(
            f"no reasoning data: run {_HOW_TO_GET}, or set task.data_dir (fixtures for the stand-ins)"
        )
    folder = (FIXTURES_DIR if data_dir == "fixtures" else Path(data_dir).expanduser()) / name
    if not (folder / DATA_FILE).is_file():
        raise FileNotFoundError(f"{folder / DATA_FILE} not found; run {_HOW_TO_GET} (or task.data_dir=fixtures)")
    return folder


def wilson_interval(successes: float, total: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion (0-1); ``(0, 0)`` for ``total == 0``."""
    if total == 0:
        return 0.0, 0.0
    p = successes / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


class ReasoningDataset(TaskDataset):
    """One benchmark (gsm8k, math500, aime24 or aime25); with ``n_samples > 1`` each question appears
    ``n_samples`` times (ids ``<index>#<k>``), each drawing from its own seed."""

    metric_name = "accuracy"
    chat_template = False
    truncation = "none"
    stop_strings = STOP_STRINGS

    def __init__(self, name: str, *, data_dir: str | None, num_samples: int | None, options: dict[str, Any]) -> None:
        self.name = name
        self.data_name, default_length = DATASETS[name]
        cap = options["max_new_tokens"]
        self.max_new_tokens = default_length if cap is None else min(default_length, int(cap))
        self.grader = options["grader"]
        self.n_samples = int(options["n_samples"])
        sampled = options["sampling"] == "sampled"
        self.sampling = (
            Sampling(float(options["temperature"]), float(options["top_p"]), int(options["seed"])) if sampled else None
        )
        self.data_dir, self.num_samples = data_dir, num_samples
        self._samples: list[Sample] | None = None
        self._provenance: dict[str, Any] = {}

    def samples(self) -> Sequence[Sample]:
        if self._samples is None:
            folder = _dataset_folder(self.data_dir, self.name)
            provenance.verify_prepared(folder, DATA_FILE, _HOW_TO_GET)
            path = folder / DATA_FILE
            examples = load_examples(path)[: self.num_samples]
            self._samples = []
            for index, example in enumerate(examples):
                prompt = format_prompt(official_question(example, self.data_name))
                answer = ground_truth(example, self.data_name)
                written = reference_text(example, self.data_name)
                for k in range(self.n_samples):
                    sample_id = str(index) if self.n_samples == 1 else f"{index}#{k}"
                    extra = {"question_index": index, "draw": k, "reference_text": written}
                    self._samples.append(
                        Sample(id=sample_id, context=prompt, question="", answers=[answer], extra=extra)
                    )
            how = _HOW_TO_GET
            fixture = folder.parent == FIXTURES_DIR
            self._provenance = {
                "data": provenance.stand_in(path, DATA_FILE, how) if fixture else provenance.official(path)
            }
        return self._samples

    def provenance(self) -> dict[str, dict[str, Any]]:
        self.samples()
        return self._provenance

    def is_correct(self, prediction: str, reference: str, reference_as_written: str | None = None) -> bool:
        """Whether a raw generation answers ``reference`` (the normalised reference answer) by the chosen grader:
        ``official`` -- :func:`~kvbench.metrics.math_answer.official_prediction` of the output (stripped, cut at the
        stop words, as ``math_eval.py``) graded by ``math_equal``; ``math_verify`` -- the package's ``verify`` of the
        raw output against the reference as written (``reference_as_written``, ``\\boxed{}``-wrapped; the
        normalised one would reach it mangled: ``strip_string`` turns ``\\frac{a}{b}`` into ``\\frac{}{b}``)."""
        if self.grader == "math_verify":
            from math_verify import parse, verify

            gold = reference if reference_as_written is None else reference_as_written
            return bool(verify(parse("\\boxed{" + gold + "}"), parse(prediction)))
        code = prediction.strip()
        for stop in STOP_STRINGS:
            code = code.split(stop)[0].strip()
        answer = official_prediction(code, self.data_name, reference)
        return answer is not None and math_equal(answer, reference)

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        """Accuracy (0-100): the mean over every generated sample (``score``), with a 95 % interval over questions
        (``ci_low``/``ci_high``: Wilson interval of the per-question mean accuracies' total), ``n_questions``,
        ``n_samples`` per question and, with several samples, ``pass_at_n`` (a question solved by any draw) and
        ``first_draw`` (the official ``evaluate.py``'s ``acc``: the first draw of each question)."""
        if len(predictions) != len(samples):
            raise ValueError(f"{len(predictions)} predictions for {len(samples)} samples in {self.name!r}")
        per_question: dict[int, list[bool]] = {}
        guard = ScoreGuard()  # a grading error scores the sample wrong, recorded (the official pool: a timeout)
        for prediction, sample in zip(predictions, samples, strict=True):
            written = sample.extra.get("reference_text")
            correct = bool(guard(sample.id, self.is_correct, prediction, sample.answers[0], written))
            per_question.setdefault(int(sample.extra.get("question_index", 0)), []).append(correct)
        means = [sum(hits) / len(hits) for hits in per_question.values()]
        accuracy = sum(means) / len(means) if means else 0.0
        low, high = wilson_interval(sum(means), len(means))
        scores = {
            "score": 100 * accuracy,
            "ci_low": 100 * low,
            "ci_high": 100 * high,
            "n_questions": float(len(means)),
            "n_samples": float(self.n_samples),
        }
        if self.n_samples > 1:
            scores["pass_at_n"] = 100 * sum(any(hits) for hits in per_question.values()) / len(per_question)
            # evaluate.py's "acc": the mean of the score matrix's first column, i.e. the first draw of each question
            scores["first_draw"] = 100 * sum(hits[0] for hits in per_question.values()) / len(per_question)
        return scores

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update({"benchmark": "reasoning", "official_data_name": self.data_name, "prompt_type": "qwen25-math-cot"})
        info.update({"grader": self.grader, "n_samples": self.n_samples})
        return info


def _options(task_cfg: Any) -> dict[str, Any]:
    given = dict(getattr(task_cfg, "options", None) or {})
    check_known_keys(given, VALID_OPTIONS, "task.options", "reasoning")
    merged = {**VALID_OPTIONS, **given}
    check_choice("task.options.sampling", merged["sampling"], SAMPLING_MODES)
    check_choice("task.options.grader", merged["grader"], GRADERS)
    for key in ("n_samples", "max_new_tokens"):
        value = merged[key]
        if value is None and key == "max_new_tokens":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"task.options.{key} must be a positive integer, got {value!r}")
    if merged["n_samples"] > 1 and merged["sampling"] != "sampled":
        raise ValueError(
            f"task.options.n_samples={merged['n_samples']} needs task.options.sampling=sampled (greedy draws are equal)"
        )
    if merged["sampling"] == "sampled":
        Sampling(float(merged["temperature"]), float(merged["top_p"]), int(merged["seed"]))  # range checks
    return merged


def _setting(task: Any, key: str) -> Any:
    """``task[key]`` of a mapping (DictConfig, dict) or ``task.key`` of a config object; ``None`` when absent."""
    return task.get(key) if hasattr(task, "get") else getattr(task, key, None)


def _dataset_names(task: Any) -> list[str]:
    requested = _setting(task, "datasets")
    return list(requested) if requested else list(DATASETS)


def _required_packages(task: Any) -> list[PackageNeed]:
    options = _setting(task, "options") or {}
    if options.get("grader") == "math_verify":
        fix = "pip install 'kvbench[reasoning]' (math-verify), or task.options.grader=official"
        return [PackageNeed("math_verify", "task.options.grader=math_verify", fix)]
    return []


@register_task(
    "reasoning",
    dataset_names=_dataset_names,
    required_packages=_required_packages,
    data_dir_values={"fixtures": "the shipped reasoning stand-in fixtures"},
)
def build_reasoning(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """The datasets of ``task.datasets`` (default: all four), in the order given."""
    options = _options(task_cfg)
    names = _dataset_names(task_cfg)
    unknown = [name for name in names if name not in DATASETS]
    if unknown:
        raise ValueError(f"unknown dataset(s) {unknown} for task 'reasoning'; valid datasets: {', '.join(DATASETS)}")
    num_samples = getattr(task_cfg, "num_samples", None)
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"task.num_samples must be >= 1 or null, got {num_samples}")
    data_dir = getattr(task_cfg, "data_dir", None)
    return [ReasoningDataset(name, data_dir=data_dir, num_samples=num_samples, options=options) for name in names]


def _download(source: str, target: Path) -> None:
    if source.startswith("hub:"):
        from huggingface_hub import hf_hub_download

        _, repo, filename = source.split(":", 2)
        shutil.copyfile(hf_hub_download(repo_id=repo, filename=filename, repo_type="dataset"), target)
        return
    with urllib.request.urlopen(source, timeout=60) as response:  # fixed https URLs (SOURCES)
        target.write_bytes(response.read())


@register_data_preparer("reasoning")
def prepare_reasoning(target_dir: Path, datasets: Sequence[str] | None = None) -> None:
    """Download each dataset's jsonl into ``target_dir/<name>/test.jsonl``, check that every line parses and yields a
    question and reference answer, and write ``MANIFEST.json`` (source, sha256, lines), verified on every read."""
    for name in datasets or list(DATASETS):
        folder = Path(target_dir) / name
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{DATA_FILE}.tmp"
        _download(SOURCES[name], tmp)
        write_prepared(folder, tmp, name, SOURCES[name])


def write_prepared(folder: Path, downloaded: Path, name: str, source: str) -> None:
    """Check that ``downloaded`` parses as dataset ``name``, move it to ``folder/test.jsonl`` and write the manifest."""
    examples = load_examples(downloaded)
    for index, example in enumerate(examples):
        try:
            official_question(example, DATASETS[name][0])
        except (KeyError, IndexError) as err:
            raise ValueError(f"{source} line {index + 1}: missing field {err} for {name}") from err
    downloaded.replace(folder / DATA_FILE)
    provenance.write_manifest(folder, {"source": source}, {DATA_FILE: len(examples)})
    print(f"reasoning: wrote {len(examples)} {name} questions to {folder / DATA_FILE}")
