"""One generated RULER sample (:class:`Generated`) and the generator base with RULER HEAD's size search
(:class:`SizedGenerator`): lengths are measured on the prompt as the model will see it."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvbench.prompting import render_prompt
from kvbench.tasks.ruler.inputs import RulerInputs
from kvbench.tasks.ruler.spec import RulerTask
from kvbench.tasks.text_inputs import TextTokenizer

#: Texts whose token count a generator keeps (:meth:`SizedGenerator._count_text`).
COUNTS_KEPT = 64


@dataclass
class Generated:
    """One generated RULER sample before it becomes a :class:`Sample` (``shots``: worked examples, each ``(task
    text, answer prefix + answer)``, rendered as complete turns before the prompt)."""

    context: str
    question: str
    answer_prefix: str
    answers: list[str]
    extra: dict[str, Any] = field(default_factory=dict)
    shots: tuple[tuple[str, str], ...] = ()

    def as_sample_parts(self, answer_prefix_mode: str) -> dict[str, Any]:
        """``context``/``question``/``answer_prefix``/``shots`` of the :class:`Sample` for an answer-prefix mode."""
        if answer_prefix_mode == "assistant":
            return {"context": self.context, "question": self.question, "answer_prefix": self.answer_prefix,
                    "shots": self.shots}  # fmt: skip
        inline = "".join(user + reply + "\n" for user, reply in self.shots)
        return {"context": inline + self.context, "question": self.question + self.answer_prefix,
                "answer_prefix": "", "shots": ()}  # fmt: skip


class SizedGenerator:
    """What every RULER generator shares: its settings, the seeded ``rng`` and RULER's size search (the family
    generators of :mod:`kvbench.tasks.ruler` subclass it; :class:`~kvbench.tasks.ruler.datasets.RulerGenerator`
    combines them).  Deterministic for a seed.

    Lengths are measured on the prompt as the model will see it (``use_chat_template``: the model's chat template
    included; ``answer_prefix_mode``: where the answer prefix goes), in ``tokenizer.tokenize`` tokens.
    """

    def __init__(
        self,
        task: RulerTask,
        length: int,
        tok: TextTokenizer,
        seed: int,
        max_new_tokens: int,
        inputs: RulerInputs,
        *,
        use_chat_template: bool = False,
        answer_prefix_mode: str = "assistant",
        ruler_template: str = "{task_template}",
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.task = task
        self.length = length
        self.tok = tok
        self.seed = seed
        self.max_new_tokens = max_new_tokens
        self.inputs = inputs
        self.use_chat_template = use_chat_template
        self.answer_prefix_mode = answer_prefix_mode
        #: Extra variables of the model's chat template when lengths count it (``use_chat_template``).
        self.template_kwargs = template_kwargs
        #: RULER's model template (``scripts/data/template.py``) around the task text: what comes before and after.
        self.template_head, self.template_tail = ruler_template.split("{task_template}")
        self.rng = random.Random(seed)
        self.args = task.args
        #: Smallest unit count a sample can be built with (VT needs one noise line per chain line).
        self.min_units = task.args["num_hops"] + 1 if task.generator == "vt" else 1
        #: ``tok.count`` per exact text lately measured: the size search and the fit loop measure some candidate
        #: prompts twice (the probe, the best unit count); the tokenizer is deterministic, so the count is reused.
        #: The last :data:`COUNTS_KEPT` texts only (one sample's search measures a dozen or two), so memory stays flat.
        self._token_counts: dict[str, int] = {}

    def _wrap(self, sample: Generated, head: str | None = None, tail: str | None = None) -> Generated:
        """``sample`` inside RULER's model template (``head``/``tail``: default the generator's): the head before the
        context, the tail after the question, each worked example's task text wrapped alike (RULER formats its
        few-shot examples with the full template).  The base template is a no-op."""
        head = self.template_head if head is None else head
        tail = self.template_tail if tail is None else tail
        sample.context = head + sample.context
        sample.question = sample.question + tail
        sample.shots = tuple((head + user + tail, reply) for user, reply in sample.shots)
        return sample

    def count(self, sample: Generated) -> int:
        """Tokens of the full model input (chat template and answer prefix included), RULER's ``text_to_tokens``."""
        if self.tok.tokenizer is None:
            return self._count_text(sample.context + sample.question + sample.answer_prefix)
        parts = sample.as_sample_parts(self.answer_prefix_mode)
        text = render_prompt(
            self.tok.tokenizer, **parts, use_chat_template=self.use_chat_template, template_kwargs=self.template_kwargs
        ).text
        return self._count_text(text)

    def _count_text(self, text: str) -> int:
        """``tok.count(text)``, measured once per exact text."""
        if text not in self._token_counts:
            if len(self._token_counts) >= COUNTS_KEPT:
                del self._token_counts[next(iter(self._token_counts))]  # the oldest
            self._token_counts[text] = self.tok.count(text)
        return self._token_counts[text]

    def fits(self, sample: Generated, extra_tokens: int = 0) -> bool:
        return self.count(sample) + extra_tokens + self.max_new_tokens <= self.length

    def search(
        self,
        build: Callable[[int], Generated],
        incremental: int,
        *,
        extra_tokens: int = 0,
        probe_units: int | None = None,
        estimate: Callable[[float], int] | None = None,
    ) -> tuple[int, int]:
        """``(incremental, units)``: RULER HEAD's size search, with RULER's draws.

        One probe of ``probe_units`` (default ``incremental``) units estimates the tokens per unit; a binary search
        between ``incremental`` and ``max(estimate(per_unit), 2 * incremental)`` (default estimate
        ``int(length / per_unit * 3)``) finds the largest unit count whose freshly built sample fits
        (``extra_tokens``: tokens counted on top of each sample, VT's worked example).  Only when a probe of
        ``incremental`` units does not fit (lengths below what the official unit allows, e.g. a 500-word essay unit
        at 1K tokens, where RULER itself would loop forever) is ``incremental`` halved and the probe rebuilt: extra
        draws RULER never makes, at lengths RULER cannot generate."""
        probe = build(probe_units or incremental)
        while probe_units is None and incremental // 2 >= self.min_units and not self.fits(probe, extra_tokens):
            incremental //= 2
            probe = build(incremental)
        per_unit = max(self.count(probe) / (probe_units or incremental), 1e-9)
        guess = estimate(per_unit) if estimate is not None else int(self.length / per_unit * 3)
        upper = max(guess, 2 * incremental)
        lower, best = incremental, incremental
        while lower <= upper:
            mid = (lower + upper) // 2
            if self.fits(build(mid), extra_tokens):
                best, lower = mid, mid + 1
            else:
                upper = mid - 1
        return incremental, best

    def fit_sample(self, build: Callable[[int], Generated], units: int, incremental: int) -> Generated:
        """Build with ``units``; while too long, retry with ``units - incremental`` (error below one unit)."""
        while True:
            sample = build(units)
            if self.fits(sample):
                sample.extra["units"] = units
                return sample
            # Below one unit above the minimum, step by 1 (RULER itself would fail there).
            units = units - incremental if units - incremental >= self.min_units else units - 1
            if units < self.min_units:
                raise ValueError(
                    f"RULER {self.task.name}: cannot fit a sample into {self.length} tokens "
                    f"(template + {self.max_new_tokens} new tokens are too long)"
                )

    def generate(self, num_samples: int) -> list[Generated]:
        generator = getattr(self, f"_generate_{self.task.generator}")
        return generator(num_samples)

    def _depth(self, text: str, position: int) -> float:
        """Depth in percent of character offset ``position`` of ``text``, measured in tokens."""
        total = self._count_text(text)
        return 100.0 * self.tok.count(text[:position]) / max(total, 1)
