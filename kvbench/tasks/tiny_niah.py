"""``task=tiny_niah``: offline RULER-like needle-in-a-haystack tasks for the tiny retrieval model.

Three variants, each at any target length (default grid 1K/2K/4K tokens), modelled on RULER's NIAH
(``/work/shared/specs/benchmarks.md`` section 2) but written for the word-level vocabulary of
``models/tiny-niah`` (:mod:`kvbench.models.tiny`):

``niah_single``
    One needle ``one of the special magic numbers is <key> <value> .`` inside a filler haystack
    (random plain-English sentences, like RULER's ``noise`` haystack); the question names its key.
``niah_multikey``
    :data:`MULTIKEY_NEEDLES` needles with distinct keys at random depths in the filler haystack (RULER
    ``niah_multikey_1`` has four); the question names one of them.  In question-agnostic mode nothing in the
    context tells which needle will be asked.
``niah_multivalue``
    One key with four values in four needles at different depths (RULER ``niah_multivalue``); the answer must
    contain all four values.  Unlike RULER, each of these needles carries an ordinal after the key, in order of
    appearance (``... numbers is bakodi second 12 45 .``), and the answer enumerates them: a tiny model then
    retrieves each value by ``<key> <ordinal>`` like a single needle, instead of having to remember which values
    it already gave (the unlabelled format capped the shipped model at about 55 % with the full cache).  What
    eviction must keep is unchanged: all four needles.

Every value is :data:`VALUE_TOKENS` number tokens (``"57 83"``), and no number token occurs twice in a sample.
Multi-token values are what make eviction measurable: in question-aware mode the first answer token is computed
during prefill, before any layer is compressed, so it is the same for every method; the following tokens are
decoded from the compressed cache and are only right when the needle survived eviction.

Prompt = ``context`` (header + haystack, ending in a newline) + ``question`` (question + answer prefix), e.g.
``... what is the special magic number for bakodi ? the special magic number is bakodi`` -> `` 57 83 .``.
A multi-value answer repeats the key and names the ordinal before every further value: ``... numbers are bakodi
first`` -> `` 57 83 , bakodi second 12 45 , bakodi third 33 21 , bakodi fourth 81 90``.
The key sits right before its value in needles and answer prefixes (as in associative-recall data), which is what
lets a tiny model learn content-based retrieval on a CPU budget.
Scoring is RULER's ``string_match_all``: per sample the fraction of reference values found in the prediction,
averaged, times 100.

The training-data generator of ``scripts/train_tiny.py`` is :mod:`kvbench.tasks.tiny_niah_training`; this module
holds a plain full-cache greedy decoder (:func:`greedy_generate`) used by the training log and the tests.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvbench.checks import check_known_keys
from kvbench.models import tiny as tiny_model
from kvbench.models.tiny import FILLER_WORDS, KEY_WORDS, VALUE_WORDS
from kvbench.storage.sample_cache import cached_samples, source_fingerprint, tokenizer_fingerprint
from kvbench.tasks.base import Sample, TaskDataset, register_task, select_datasets

#: Task variants, in dataset order.
VARIANTS: tuple[str, ...] = ("niah_single", "niah_multikey", "niah_multivalue")
#: Default target lengths (tokens, prompt + tokens to generate) when the config gives none.
DEFAULT_LENGTHS: tuple[int, ...] = (1024, 2048, 4096)
#: Default number of samples per dataset when ``task.num_samples`` is null.
DEFAULT_NUM_SAMPLES = 50
#: Values per key in niah_multivalue.
NUM_MULTI_VALUES = 4
#: Needles (distinct keys, one asked) in niah_multikey.
MULTIKEY_NEEDLES = 16
#: Default share of training sequences that drill multi-value answers
#: (:func:`kvbench.tasks.tiny_niah_training.training_example`).
MULTI_FOCUS_SHARE = 0.3
#: Option keys accepted in ``task.options`` (none today; unknown keys are rejected).
VALID_OPTIONS: frozenset[str] = frozenset()

HEADER_SINGULAR = (
    "a special magic number is hidden within the following text . make sure to memorize it . "
    "i will quiz you about the number afterwards ."
)
HEADER_PLURAL = (
    "some special magic numbers are hidden within the following text . make sure to memorize them . "
    "i will quiz you about the numbers afterwards ."
)
NEEDLE = "one of the special magic numbers is {key} {value} ."
#: A needle of niah_multivalue: the key, then the needle's ordinal among the key's needles (order of appearance).
MULTI_NEEDLE = "one of the special magic numbers is {key} {ordinal} {value} ."
#: Ordinals of the multi-value needles, in order of appearance (one per value).
ORDINALS: tuple[str, ...] = ("first", "second", "third", "fourth")
QUESTION_SINGULAR = "what is the special magic number for {key} ? the special magic number is {key}"
QUESTION_PLURAL = "what are all the special magic numbers for {key} ? the special magic numbers are {key} {ordinal}"

#: Number tokens per needle value (``"57 83"``); every number token occurs at most once per sample.
VALUE_TOKENS = 2
#: Tokens to generate per variant (RULER counts them in the target length): one value and its full stop, or
#: ``v , key second v , key third v , key fourth v`` for the four values of niah_multivalue.
MAX_NEW_TOKENS: dict[str, int] = {
    "niah_single": VALUE_TOKENS + 1,
    "niah_multikey": VALUE_TOKENS + 1,
    "niah_multivalue": VALUE_TOKENS + (NUM_MULTI_VALUES - 1) * (VALUE_TOKENS + 3),
}
if len(ORDINALS) != NUM_MULTI_VALUES:
    raise AssertionError(f"need one ordinal per multi-value needle: {len(ORDINALS)} != {NUM_MULTI_VALUES}")


def dataset_name(variant: str, length: int) -> str:
    """``niah_single_2k`` for multiples of 1024 tokens, else ``niah_single_1500``."""
    return f"{variant}_{length // 1024}k" if length % 1024 == 0 else f"{variant}_{length}"


def filler_sentence(rng: random.Random) -> list[str]:
    """One random haystack sentence: 4-10 filler words and a full stop."""
    return [*rng.choices(FILLER_WORDS, k=rng.randint(4, 10)), "."]


def draw_values(rng: random.Random, count: int) -> list[str]:
    """``count`` values of :data:`VALUE_TOKENS` number tokens each, no number token repeated."""
    tokens = rng.sample(VALUE_WORDS, count * VALUE_TOKENS)
    return [" ".join(tokens[i : i + VALUE_TOKENS]) for i in range(0, len(tokens), VALUE_TOKENS)]


def needle_words(key: str, value: str, ordinal: str | None = None) -> list[str]:
    """The words of one needle; with ``ordinal``, a multi-value needle (:data:`MULTI_NEEDLE`)."""
    if ordinal is None:
        return NEEDLE.format(key=key, value=value).split()
    return MULTI_NEEDLE.format(key=key, ordinal=ordinal, value=value).split()


def multivalue_answer(key: str, values: Sequence[str]) -> list[str]:
    """The words of a multi-value answer after the question (which ends in ``<key> first``):
    ``v1 , <key> second v2 , <key> third v3 , <key> fourth v4`` (no closing full stop: generation ends there)."""
    words: list[str] = []
    for index, value in enumerate(values):
        if index:
            words.extend([",", key, ORDINALS[index]])
        words.extend(value.split())
    return words


@dataclass(frozen=True)
class NiahInstance:
    """One generated prompt before sizing: context words, question words, answers and metadata."""

    context: list[str]
    question: list[str]
    answers: list[str]
    key: str
    depths: list[float]


def _insert_at_depths(units: list[list[str]], needles: list[list[str]], depths: Sequence[float]) -> list[list[str]]:
    """Insert each needle before unit ``int(len(units) * depth / 100)`` (deepest first, so indices stay valid)."""
    units = list(units)
    for depth, needle in sorted(zip(depths, needles, strict=True), key=lambda pair: -pair[0]):
        units.insert(int(len(units) * depth / 100.0), needle)
    return units


def build_instance(variant: str, num_units: int, depth: float, seed: str) -> NiahInstance:
    """Generate one prompt of ``variant`` with ``num_units`` haystack units (sentences or distractor needles).

    Deterministic in ``(variant, num_units, depth, seed)``; keys, values and the haystack are drawn from
    ``random.Random(seed)`` before the haystack length is used, so growing ``num_units`` only appends units.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown tiny_niah variant {variant!r}; valid: {', '.join(VARIANTS)}")
    rng = random.Random(seed)
    keys = list(KEY_WORDS)
    rng.shuffle(keys)
    key = keys[0]
    if variant == "niah_multivalue":
        values = draw_values(rng, NUM_MULTI_VALUES)
        needles = [needle_words(key, v, ORDINALS[0]) for v in values]  # ordinals set in order of appearance below
        depths = [float(depth)] + [float(rng.randint(0, 100)) for _ in range(NUM_MULTI_VALUES - 1)]
    else:
        num_needles = MULTIKEY_NEEDLES if variant == "niah_multikey" else 1
        all_values = draw_values(rng, num_needles)
        values = all_values[:1]
        needles = [needle_words(k, v) for k, v in zip(keys[:num_needles], all_values, strict=True)]
        depths = [float(depth)] + [float(rng.randint(0, 100)) for _ in range(num_needles - 1)]
    unit_rng = random.Random(f"{seed}-haystack")
    units = [filler_sentence(unit_rng) for _ in range(num_units)]
    units = _insert_at_depths(units, needles, depths)
    if variant == "niah_multivalue":  # label the needles first ... fourth in the order they appear
        by_identity = {id(needle): (value, d) for needle, value, d in zip(needles, values, depths, strict=True)}
        appearance = [by_identity[id(unit)] for unit in units if id(unit) in by_identity]
        values, depths = [value for value, _ in appearance], [d for _, d in appearance]
        labelled = iter(needle_words(key, value, ordinal) for value, ordinal in zip(values, ORDINALS, strict=True))
        units = [next(labelled) if id(unit) in by_identity else unit for unit in units]
        header, question = HEADER_PLURAL, QUESTION_PLURAL.format(key=key, ordinal=ORDINALS[0])
    else:
        header, question = HEADER_SINGULAR, QUESTION_SINGULAR.format(key=key)
    context = header.split() + [word for unit in units for word in unit]
    return NiahInstance(context, question.split(), values, key, depths)


def _count_tokens(tokenizer: Any, text: str) -> int:
    """Prompt tokens as RULER counts them (no special tokens).  ``verbose=False``: the size search probes prompts
    longer than the model's maximum on purpose, which is not worth a warning."""
    return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def _texts(instance: NiahInstance) -> tuple[str, str]:
    """Context (ends with a newline) and question strings of an instance."""
    return " ".join(instance.context) + "\n", " ".join(instance.question)


def check_length(variant: str, length: int, seed: str, tokenizer: Any) -> None:
    """Raise ``ValueError`` naming the minimum when ``length`` cannot hold a ``variant`` prompt with an empty
    haystack plus its answer (``MAX_NEW_TOKENS``)."""
    empty = _count_tokens(tokenizer, "".join(_texts(build_instance(variant, 0, 50.0, seed))))
    minimum = empty + MAX_NEW_TOKENS[variant]
    if minimum > length:
        raise ValueError(
            f"task.lengths: {length} tokens is too short for {variant} with this tokenizer (prompt without "
            f"haystack + answer = {minimum} tokens); use a length >= {minimum} or drop that dataset via task.datasets"
        )


def sized_instance(variant: str, length: int, depth: float, seed: str, tokenizer: Any) -> tuple[NiahInstance, int]:
    """The largest instance whose prompt plus ``MAX_NEW_TOKENS[variant]`` fits ``length`` tokens (binary search).

    Returns the instance and its prompt token count.
    """
    budget = length - MAX_NEW_TOKENS[variant]

    def tokens(num_units: int) -> int:
        context, question = _texts(build_instance(variant, num_units, depth, seed))
        return _count_tokens(tokenizer, context + question)

    check_length(variant, length, seed, tokenizer)
    probe = 20
    per_unit = max(1.0, (tokens(probe) - tokens(0)) / probe)
    low, high = 0, max(probe, int(budget / per_unit * 2) + 2)
    while tokens(high) <= budget:  # widen if the estimate was short
        low, high = high, high * 2
    while high - low > 1:  # invariant: tokens(low) fits, tokens(high) does not
        middle = (low + high) // 2
        if tokens(middle) <= budget:
            low = middle
        else:
            high = middle
    instance = build_instance(variant, low, depth, seed)
    return instance, tokens(low)


def postprocess_ruler(prediction: str) -> str:
    """RULER's post-processing: strip, control characters to newlines, strip."""
    return re.sub(r"[\x00-\x1f]", "\n", prediction.strip()).strip()


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """RULER ``string_match_all`` for one sample: fraction of references contained in the prediction (lower-cased)."""
    if not references:
        raise ValueError("a sample needs at least one reference answer")
    lowered = prediction.lower()
    return sum(reference.lower() in lowered for reference in references) / len(references)


#: Needle depths of the first samples when ``task.depths`` is null: 0..100 % in this many evenly spaced points.
DEPTH_GRID_POINTS = 10


def spread_depth(index: int) -> float:
    """Needle depth (percent) of sample ``index`` when ``task.depths`` is null, independent of ``task.num_samples``.

    Samples 0..9 sit at ``0, 11.11, ..., 100`` (10 evenly spaced depths: the default run's samples); later ones fill
    the midpoints of the grid so far, level by level (samples 10..18 at ``5.56, 16.67, ..., 94.44``, then the 18
    midpoints of that 18-interval grid, ...).  So the first N samples of a longer run are exactly the samples of a
    run with ``task.num_samples=N``: a run folder grows (10 samples, then 50) without regenerating anything
    (docs/results.md: the sample count is a run's extent)."""
    intervals = DEPTH_GRID_POINTS - 1
    if index < DEPTH_GRID_POINTS:
        return round(100.0 * index / intervals, 2)
    index -= DEPTH_GRID_POINTS
    while index >= intervals:  # each level adds one midpoint per interval of the grid before it
        index -= intervals
        intervals *= 2
    return round(100.0 * (2 * index + 1) / (2 * intervals), 2)


class TinyNiahDataset(TaskDataset):
    """One variant of tiny NIAH at one target length."""

    chat_template = False
    stop_strings = (".",)
    metric_name = "string_match_all"

    def __init__(
        self, variant: str, length: int, num_samples: int, seed: int, tokenizer: Any, depths: Sequence[float] | None
    ) -> None:
        self.variant = variant
        self.length = length
        self.name = dataset_name(variant, length)
        self.max_new_tokens = MAX_NEW_TOKENS[variant]
        self.num_samples = num_samples
        self.seed = seed
        self.depths = list(depths) if depths else None
        self._tokenizer = tokenizer
        self._samples: list[Sample] | None = None

    def sample_depth(self, index: int) -> float:
        """Needle depth of sample ``index``: cycles through ``task.depths``, else :func:`spread_depth`."""
        if self.depths:
            return float(self.depths[index % len(self.depths)])
        return spread_depth(index)

    def cache_key(self) -> dict[str, Any]:
        """Everything the samples depend on (:mod:`kvbench.storage.sample_cache`): not ``num_samples`` (sample i never
        depends on it), so one stored generation serves every shorter request."""
        return {
            "dataset": self.name,
            "seed": self.seed,
            "depths": self.depths,
            "tokenizer": tokenizer_fingerprint(self._tokenizer),
            "code": source_fingerprint([__file__, tiny_model.__file__]),
        }

    def samples(self) -> list[Sample]:
        """Generate (once; read back from ``run.sample_cache`` when stored there) and return the samples."""
        if self._samples is None:
            self._samples = cached_samples(
                self.sample_cache, "tiny_niah", self.name, self.cache_key, self.num_samples, self._generate
            )
        return self._samples

    def _generate(self, count: int) -> list[Sample]:
        """The first ``count`` samples, generated."""
        samples = []
        for index in range(count):
            depth = self.sample_depth(index)
            seed = f"tiny_niah-{self.seed}-{self.variant}-{self.length}-{index}"
            instance, num_tokens = sized_instance(self.variant, self.length, depth, seed, self._tokenizer)
            context, question = _texts(instance)
            samples.append(
                Sample(
                    id=f"{self.name}-{index}",
                    context=context,
                    question=question,
                    answers=list(instance.answers),
                    length=num_tokens,
                    extra={
                        "variant": self.variant,
                        "target_length": self.length,
                        "prompt_tokens": num_tokens,
                        "depth": depth,
                        "needle_depths": instance.depths,
                        "key": instance.key,
                    },
                )
            )
        return samples

    def postprocess(self, prediction: str) -> str:
        """RULER post-processing (strip, control characters to newlines)."""
        return postprocess_ruler(prediction)

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        """``string_match_all`` x 100 (rounded to 2 decimals), plus the number of empty predictions."""
        if len(predictions) != len(samples):
            raise ValueError(f"{len(predictions)} predictions for {len(samples)} samples")
        if not samples:
            return {"score": 0.0, "nulls": 0.0}
        matches = [string_match_all(p, s.answers) for p, s in zip(predictions, samples, strict=True)]
        return {
            "score": round(100.0 * sum(matches) / len(matches), 2),
            "nulls": float(sum(not p.strip() for p in predictions)),
        }

    def describe(self) -> dict[str, Any]:
        """Settings recorded in metrics.json."""
        return {**super().describe(), "variant": self.variant, "target_length": self.length, "seed": self.seed}


def _lengths(task_cfg: Any) -> list[int]:
    """Target lengths from ``task.lengths``, else ``task.length``, else :data:`DEFAULT_LENGTHS`."""
    lengths = getattr(task_cfg, "lengths", None)
    if lengths:
        return [int(n) for n in lengths]
    length = getattr(task_cfg, "length", None)
    return [int(length)] if length else list(DEFAULT_LENGTHS)


def _dataset_names(task: Any) -> list[str]:
    """The datasets a tiny_niah config runs (:data:`~kvbench.tasks.base.DatasetNames`): every variant at each of
    ``task.lengths`` (or ``task.length``, or the default lengths)."""
    lengths = task["lengths"] or ([task["length"]] if task["length"] else list(DEFAULT_LENGTHS))
    return [dataset_name(variant, int(length)) for length in lengths for variant in VARIANTS]


@register_task("tiny_niah", dataset_names=_dataset_names)
def build_tiny_niah(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """Datasets ``<variant>_<len>`` for every variant x target length, filtered by ``task.datasets``."""
    check_known_keys(getattr(task_cfg, "options", None) or {}, VALID_OPTIONS, "task.options", "task 'tiny_niah'")
    num_samples = getattr(task_cfg, "num_samples", None)
    num_samples = DEFAULT_NUM_SAMPLES if num_samples is None else int(num_samples)
    by_name: dict[str, tuple[str, int]] = {}
    for length in _lengths(task_cfg):
        for variant in VARIANTS:
            by_name[dataset_name(variant, length)] = (variant, length)
    chosen = select_datasets(list(by_name), getattr(task_cfg, "datasets", None), getattr(task_cfg, "name", "tiny_niah"))
    for name in chosen:  # fail before any work (samples are generated lazily); keys vary in length per sample
        check_length(*by_name[name], "size", tokenizer)
    seed = int(getattr(task_cfg, "seed", 42))
    depths = getattr(task_cfg, "depths", None)
    return [TinyNiahDataset(*by_name[name], num_samples, seed, tokenizer, depths) for name in chosen]


# --------------------------------------------------------------------------------------------------------------
# Full-cache greedy decoding (training log, tests)
# --------------------------------------------------------------------------------------------------------------


def greedy_generate(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int, stop: str = ".") -> str:
    """Greedy decoding with a plain transformers forward and a full KV cache; stops after ``stop`` or eos."""
    import torch

    input_ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
    generated: list[int] = []
    past = None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            out = model(input_ids=input_ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            next_id = int(out.logits[0, -1].argmax())
            if next_id == tokenizer.eos_token_id:
                break
            generated.append(next_id)
            if stop and stop in tokenizer.decode(generated):
                break
            input_ids = torch.tensor([[next_id]])
    return tokenizer.decode(generated)


def evaluate_dataset(model: Any, tokenizer: Any, dataset: TinyNiahDataset) -> dict[str, float]:
    """Full-cache greedy score of one dataset (question-aware prompt = context + question)."""
    predictions = [
        dataset.postprocess(greedy_generate(model, tokenizer, s.prompt, dataset.max_new_tokens))
        for s in dataset.samples()
    ]
    return dataset.score(predictions, dataset.samples())
