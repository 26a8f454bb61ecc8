"""NeedleBench's datasets (one subtask in one language over every length, depth and repeat), the
``needlebench`` task builder and data preparer."""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvbench.metrics.synthetic import (
    needlebench_multi_reasoning_score,
    needlebench_parallel_scores,
    needlebench_single_score,
)
from kvbench.prompting import render_prompt
from kvbench.storage.sample_cache import cached_samples, source_fingerprint, tokenizer_fingerprint
from kvbench.tasks.base import Sample, TaskDataset, register_data_preparer, register_task, select_datasets
from kvbench.tasks.needlebench.inputs import NeedleBenchInputs, unique_needles
from kvbench.tasks.needlebench.spec import (
    BUFFER_ZH,
    GENERATOR_VERSION,
    GROUPS,
    LANGUAGES,
    OPTION_DEFAULTS,
    REASONING_DIFF,
    REPEATS,
    SIZE_BY_LENGTH,
    SIZES,
    guide_question,
    parallel_question,
    prompt_parts,
)
from kvbench.tasks.text_inputs import (
    TextTokenizer,
    hub_download,
    option_values,
    resolve_input_dir,
)

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
#: Source files whose code generates the samples (their hash is part of the sample-cache key).
GENERATOR_SOURCES = (*sorted(_HERE.glob("*.py")), _HERE.parent / "text_inputs.py", _HERE.parent / "base.py")


# ---- dataset ----------------------------------------------------------------------------------------------------


class NeedleBenchDataset(TaskDataset):
    """One NeedleBench v1 subtask in one language, over every context length, depth and repeat."""

    def __init__(
        self,
        group: str,
        language: str,
        inputs: NeedleBenchInputs,
        *,
        lengths: Sequence[int],
        depths: Sequence[float],
        buffer: int,
        repeats: int,
        seed: int,
        guide: bool,
        max_new_tokens: int,
        needle_counts: Sequence[int] = (2, 3, 4, 5),
        num_samples: int | None = None,
        use_chat_template: bool = False,
        fit_length: bool = False,
        cycle_haystack: bool = False,
    ) -> None:
        if group not in GROUPS or language not in LANGUAGES:
            raise ValueError(f"unknown NeedleBench subtask {group!r}/{language!r}")
        self.group = group
        self.language = language
        self.use_chat_template = use_chat_template
        self.name = f"{group}_{language}"
        self.inputs = inputs
        self.tok = inputs.tok
        self.lengths = [int(x) for x in lengths]
        self.depths = [float(d) for d in depths]
        self.buffer = buffer
        self.repeats = repeats
        self.seed = seed
        self.guide = guide
        self.max_new_tokens = max_new_tokens
        self.needle_counts = list(needle_counts)
        self.num_samples = num_samples
        #: Named deviations (off = OpenCompass): trim an overshooting haystack; cycle a corpus shorter than needed.
        self.fit_length = fit_length
        self.cycle_haystack = cycle_haystack
        self.metric_name = {
            "single_retrieval": "needlebench_origin",
            "multi_retrieval": "needlebench_parallel",
            "multi_reasoning": "needlebench_multi",
        }[group]
        self._samples: list[Sample] | None = None
        self._states: list[list[int]] | None = None

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            group=self.group,
            language=self.language,
            lengths=self.lengths,
            depths=self.depths,
            buffer=self.buffer,
            repeats=self.repeats,
            guide=self.guide,
            fit_length=self.fit_length,
            cycle_haystack=self.cycle_haystack,
        )
        return info

    def _input_names(self) -> list[str]:
        names = [f"haystack_{self.language}"]
        names.append("needles" if self.group != "multi_reasoning" else f"reasoning_{self.language}")
        return names

    def provenance(self) -> dict[str, dict[str, Any]]:
        self.inputs.haystack(self.language)
        if self.group == "multi_reasoning":
            self.inputs.reasoning(self.language, self.needle_counts)
        else:
            self.inputs.all_needles()
        return {name: self.inputs.sources[name] for name in self._input_names()}

    def cache_key(self) -> dict[str, Any]:
        """Everything the samples depend on (see :mod:`kvbench.storage.sample_cache`)."""
        return {
            "dataset": self.name,
            "lengths": self.lengths,
            "depths": self.depths,
            "buffer": self.buffer,
            "repeats": self.repeats,
            "seed": self.seed,
            "guide": self.guide,
            "needle_counts": self.needle_counts,
            "chat_template": self.use_chat_template,
            "fit_length": self.fit_length,
            "cycle_haystack": self.cycle_haystack,
            "generator_version": GENERATOR_VERSION,
            "tokenizer": tokenizer_fingerprint(self.tok.tokenizer),
            "inputs": {name: record.get("sha256") for name, record in self.provenance().items()},
            "code": source_fingerprint(GENERATOR_SOURCES),
        }

    # -- generation --

    def _seed(self, counter: int) -> int:
        """OpenCompass's ``random.seed(counter)`` (shifted by ``task.seed - 42``)."""
        return self.seed - 42 + counter

    def _counter_orders(self) -> list[list[int]]:
        """Per counter: the haystack record order after ``random.seed(counter); random.shuffle(lines)``, the
        shuffles cumulative over counters (OpenCompass reuses one list within a dataset)."""
        if self._states is None:
            order = list(range(len(self.inputs.haystack(self.language))))
            orders = []
            for counter in range(self.repeats):
                random.Random(self._seed(counter)).shuffle(order)
                orders.append(list(order))
            self._states = orders
        return self._states

    def _haystack(self, order: Sequence[int], target: int) -> list[int]:
        """The first ``target`` tokens of the records in ``order`` (OpenCompass: records appended until the target
        is reached; a shorter corpus gives a shorter haystack unless ``cycle_haystack``)."""
        tokens: list[int] = []
        for index in order:
            if len(tokens) >= target:
                break
            tokens.extend(self.inputs.record_tokens(self.language, index))
        if len(tokens) < target and self.cycle_haystack:  # deviation: cycle the shuffled records
            while len(tokens) < target:
                for index in order:
                    tokens.extend(self.inputs.record_tokens(self.language, index))
                    if len(tokens) >= target:
                        break
        return tokens[:target]

    def _cells(self) -> list[tuple[int, int, float | None, int | None]]:
        """(counter, length, depth, needle count) in sample order: counter outer, so a prefix is balanced."""
        cells = []
        for counter in range(self.repeats):
            for length in self.lengths:
                if self.group == "multi_retrieval":
                    cells.append((counter, length, None, None))
                    continue
                for depth in self.depths:
                    if self.group == "multi_reasoning":
                        cells += [(counter, length, depth, n) for n in self.needle_counts]
                    else:
                        cells.append((counter, length, depth, None))
        return cells

    def samples(self) -> list[Sample]:
        if self._samples is None:
            cells = self._cells()
            count = len(cells) if self.num_samples is None else min(self.num_samples, len(cells))
            self._samples = cached_samples(
                self.sample_cache,
                "needlebench",
                self.name,
                self.cache_key,
                count,
                lambda n: [self._make(*cell) for cell in cells[:n]],
            )
        return self._samples

    def _make(self, counter: int, length: int, depth: float | None, count: int | None) -> Sample:
        """One cell.  Every random choice reseeds with the counter, as OpenCompass (S-RT needle, M-RS record: seed
        then ``choice``; M-RT: seed then shuffle a fresh copy of the unique needles)."""
        order = self._counter_orders()[counter]
        extra: dict[str, Any] = {"context_length": length, "counter": counter, "group": self.group}
        if self.group == "single_retrieval":
            record = random.Random(self._seed(counter)).choice(self.inputs.needles(self.language))
            needles = ["\n" + record["needle"] + "\n"]
            question = record["retrieval_question"]
            answers = [record["arg2"]]
            extra.update(needle=needles[0], keyword=record["arg2"], depth=depth)
            points_pct = [depth]
        elif self.group == "multi_retrieval":
            base = unique_needles(self.inputs.all_needles(), len(self.depths), random.Random(self.seed), self.language)
            chosen = list(base)
            random.Random(self._seed(counter)).shuffle(chosen)
            needles = ["\n" + r["needle"] + "\n" for r in chosen]
            question = parallel_question(chosen, self.language)
            answers = [r["arg2"] for r in chosen]
            extra.update(keywords=answers, depths=self.depths)
            points_pct = list(self.depths)
        else:
            pool = [
                r for r in self.inputs.reasoning(self.language, self.needle_counts) if r["derivation_count"] == count
            ]
            if not pool:
                raise ValueError(f"no M-RS record with {count} needles for {self.language}")
            record = random.Random(self._seed(counter)).choice(pool)
            needles = ["\n" + d + "\n" for d in record["derivations"]]
            question = record["question"]
            answers = [record["answer"]]
            extra.update(depth=depth, num_needles=count)
            points_pct = [depth]
        if self.guide:
            question = guide_question(question, self.group, self.language)

        needle_tokens = [self.tok.encode(n) for n in needles]
        head, middle, tail = prompt_parts(self.group, self.language)
        question = middle.lstrip("\n") + question + tail
        target = max(length - self.buffer - sum(len(t) for t in needle_tokens), 0)
        trimmed = 0
        while True:
            tokens = self._haystack(order, target - trimmed)
            tokens, starts = self._insert(tokens, needle_tokens, points_pct)
            context = head + self.tok.decode(tokens) + "\n\n"
            if not self.fit_length:
                break
            excess = self._prompt_tokens(context, question) - length
            if excess <= 0 or target - trimmed <= 0:
                break
            # fit_length (deviation): OpenCompass's length buffer is sized for tiktoken; a tokenizer that spends more
            # tokens on the prompt text (e.g. SentencePiece on Chinese) overshoots the context length: trim to fit.
            trimmed = min(trimmed + excess, target)
        extra["needle_token_starts"] = starts
        extra["needles"] = [needle.strip("\n") for needle in needles]
        extra["haystack_tokens"] = len(tokens)
        extra["haystack_trimmed"] = trimmed
        sample_id = f"{self.name}_L{length}"
        sample_id += f"_D{_fmt(depth)}" if depth is not None else ""
        sample_id += f"_N{count}" if count is not None else ""
        return Sample(id=f"{sample_id}_R{counter}", context=context, question=question, answers=answers, extra=extra)

    def _prompt_tokens(self, context: str, question: str) -> int:
        """Tokens of the whole model input, as the runner encodes it (chat template included when used)."""
        if self.tok.tokenizer is None:
            return self.tok.count(context + question)
        rendered = render_prompt(self.tok.tokenizer, context, question, use_chat_template=self.use_chat_template)
        return len(self.tok.tokenizer(rendered.text, add_special_tokens=not rendered.templated).input_ids)

    def _insert(
        self, tokens: list[int], needle_tokens: list[list[int]], depths: Sequence[float | None]
    ) -> tuple[list[int], list[int]]:
        """Insert needles: S-RT at ``int(L * d / 100)``; M-RT needle i at depth i (shifted by earlier needles);
        M-RS first at the depth, then ``prev + len(prev) + L * diff / 100``, clipped."""
        total = len(tokens)
        if self.group == "multi_retrieval":
            points, inserted = [], 0
            for needle, depth in zip(needle_tokens, depths, strict=True):
                point = min(int(total * (float(depth) / 100)) + inserted, len(tokens))
                tokens = tokens[:point] + needle + tokens[point:]
                points.append(point)
                inserted += len(needle)
            return tokens, points
        depth = float(depths[0])  # type: ignore[arg-type]
        points = []
        for i in range(len(needle_tokens)):
            if i == 0:
                point = int(total * (depth / 100))
            else:
                point = int(points[i - 1] + len(needle_tokens[i - 1]) + total * (REASONING_DIFF / 100))
            points.append(min(point, total + sum(len(t) for t in needle_tokens[:i])))
        shifted = list(points)
        for i, needle in enumerate(needle_tokens):
            tokens = tokens[: shifted[i]] + needle + tokens[shifted[i] :]
            for j in range(i + 1, len(shifted)):
                shifted[j] += len(needle)
        return tokens, shifted

    # -- scoring --

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        """``score`` (0-100, the OpenCompass group mean), plus ``length_{L}`` and ``depth_{d}`` (and M-RS
        ``needles_{n}``) breakdowns."""
        if len(predictions) != len(samples):
            raise ValueError(f"{len(predictions)} predictions for {len(samples)} samples")
        if not samples:
            return {"score": 0.0}
        if self.group == "multi_retrieval":
            return self._score_parallel(predictions, samples)
        if self.group == "single_retrieval":
            per = [
                needlebench_single_score(p, s.extra["needle"], s.extra["keyword"])
                for p, s in zip(predictions, samples, strict=True)
            ]
        else:
            per = [
                needlebench_multi_reasoning_score(p, s.answers[0]) for p, s in zip(predictions, samples, strict=True)
            ]
        result = {"score": float(np.mean(per))}
        for key, label in (("context_length", "length"), ("depth", "depth"), ("num_needles", "needles")):
            values = sorted({s.extra[key] for s in samples if key in s.extra})
            for value in values:
                cell = [x for x, s in zip(per, samples, strict=True) if s.extra.get(key) == value]
                result[f"{label}_{_fmt(value)}"] = float(np.mean(cell))
        return result

    def _score_parallel(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        by_length: dict[int, list[int]] = {}
        for i, s in enumerate(samples):
            by_length.setdefault(int(s.extra["context_length"]), []).append(i)
        result: dict[str, float] = {}
        per_length = []
        depth_scores: dict[str, list[float]] = {}
        for length, idx in sorted(by_length.items()):
            depths = samples[idx[0]].extra["depths"]
            scores = needlebench_parallel_scores(
                [predictions[i] for i in idx], [samples[i].extra["keywords"] for i in idx], depths
            )
            result[f"length_{length}"] = scores["average_score"]
            per_length.append(scores["average_score"])
            for key, value in scores.items():
                if key.startswith("Depth"):
                    depth_scores.setdefault(key, []).append(value)
        result["score"] = float(np.mean(per_length))
        for key, values in depth_scores.items():
            result[f"depth_{key[len('Depth') :]}"] = float(np.mean(values))
        return result


def _dataset_names(task: Any) -> list[str]:
    """The datasets a NeedleBench config runs (:data:`~kvbench.tasks.base.DatasetNames`): each group in
    ``task.language``, or in both languages when it is null."""
    languages = [task["language"]] if task["language"] else list(LANGUAGES)
    return [f"{group}_{language}" for group in GROUPS for language in languages]


@register_task("needlebench", dataset_names=_dataset_names)
def build_needlebench(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """Builder: datasets ``{single_retrieval,multi_retrieval,multi_reasoning}_{en,zh}`` (``task.language`` keeps one
    language; ``task.lengths`` / ``task.depths`` override the size's context lengths / depths)."""
    opts = option_values(task_cfg, OPTION_DEFAULTS, "needlebench")
    size = opts["size"] or SIZE_BY_LENGTH.get(getattr(task_cfg, "length", None) or 4096)
    if size not in SIZES:
        raise ValueError(
            f"NeedleBench size {size!r} unknown; set task.options.size to one of {', '.join(SIZES)} "
            f"(or task.length to 4096/8192/32768/131072)"
        )
    spec = SIZES[size]
    language = getattr(task_cfg, "language", None)
    if language is not None and language not in LANGUAGES:
        raise ValueError(f"task.language must be one of {', '.join(LANGUAGES)} or null, got {language!r}")
    languages = [language] if language else list(LANGUAGES)
    available = [f"{g}_{lang}" for g in GROUPS for lang in languages]
    names = select_datasets(available, getattr(task_cfg, "datasets", None), "needlebench")

    repeats = dict(REPEATS)
    if opts["repeats"] is not None:
        repeats.update(opts["repeats"] if isinstance(opts["repeats"], dict) else dict.fromkeys(GROUPS, opts["repeats"]))
    max_new = opts["max_new_tokens"]
    max_new = dict(max_new) if isinstance(max_new, Mapping) else dict.fromkeys(GROUPS, int(max_new))
    unknown = sorted(set(max_new) - set(GROUPS))
    if unknown:
        raise ValueError(f"task.options.max_new_tokens: unknown group(s) {unknown}; valid: {', '.join(GROUPS)}")
    buffers = opts["buffers"] or {}
    lengths = list(getattr(task_cfg, "lengths", None) or spec.lengths)
    depths = list(getattr(task_cfg, "depths", None) or spec.depths)
    if any(not 0 <= float(d) <= 100 for d in depths):
        raise ValueError(f"needle depths must be in [0, 100], got {depths}")

    tok = TextTokenizer(tokenizer)
    inputs = NeedleBenchInputs(resolve_input_dir(task_cfg, "needlebench", opts["source"]), tok)
    datasets: list[TaskDataset] = []
    for name in names:
        group, _, lang = name.rpartition("_")
        if lang == "en":
            buffer = int(buffers.get("en", {}).get(group, spec.buffer_en[group]))
        else:
            buffer = int(buffers.get("zh", BUFFER_ZH))
        if any(int(x) <= buffer for x in lengths):  # official too (4k M-RT EN at 1000): the haystack is empty
            log.warning("%s: context lengths %s do not exceed the %d-token buffer", name, lengths, buffer)
        datasets.append(
            NeedleBenchDataset(
                group,
                lang,
                inputs,
                lengths=lengths,
                depths=depths,
                buffer=buffer,
                repeats=int(repeats[group]),
                seed=int(getattr(task_cfg, "seed", 42)),
                guide=bool(opts["guide"]),
                max_new_tokens=int(max_new[group]),
                needle_counts=opts["needle_counts"],
                num_samples=getattr(task_cfg, "num_samples", None),
                use_chat_template=chat_template,
                fit_length=bool(opts["fit_length"]),
                cycle_haystack=bool(opts["cycle_haystack"]),
            )
        )
    return datasets


_HUB_FILES = (
    "PaulGrahamEssays.jsonl",
    "zh_finance.jsonl",
    "needles.jsonl",
    "multi_needle_reasoning_en.json",
    "multi_needle_reasoning_zh.json",
    "names.json",
)


@register_data_preparer("needlebench")
def prepare_needlebench(target_dir: Path, **options: Any) -> None:
    """Download NeedleBench v1's inputs from the HF dataset ``opencompass/NeedleBench`` into ``target_dir``.

    Options: ``repo_id`` (default ``opencompass/NeedleBench``), ``files`` (list of file names).
    """
    repo_id = options.get("repo_id", "opencompass/NeedleBench")
    for name in options.get("files", _HUB_FILES):
        hub_download(repo_id, name, Path(target_dir))


def _fmt(value: float | int | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
