"""One evaluation example (:class:`Sample`): what a task hands to the prompt builder, the runner and the scorers.

Plain data below every layer that reads samples (prompting, the sample cache, resume, the tasks);
:mod:`kvbench.tasks.base` re-exports it, so ``kvbench.tasks.base.Sample`` keeps working.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sample:
    """One evaluation example.

    Attributes
    ----------
    id:
        Unique and stable within its dataset (used to resume runs and to join predictions).
    context:
        Prompt text before the question (compressed in question-agnostic mode).
    question:
        Prompt text after the context ("" when the dataset has no separable question).
    answers:
        Reference answers; scorers take the max over them where the benchmark does.
    answer_prefix:
        Text the answer starts with, placed after the chat template's assistant header (official RULER: the model
        continues it); appended after the question when no chat template is used.  Part of the question segment.
    shots:
        Worked examples before the prompt, each ``(user message, assistant reply)``: with a chat template each is
        rendered as its own user turn followed by the reply and a newline (official RULER CWE); without one, plain
        ``user + reply + "\\n"``.  Part of the context.
    all_classes:
        Label set for classification datasets (LongBench trec/lsht/...), else ``None``.
    length:
        Benchmark-provided length (LongBench's word count, used for LongBench-E buckets), else ``None``.
    extra:
        Anything else a scorer or a report needs (needle depth, target length, ...). JSON-serialisable.
    """

    id: str
    context: str
    question: str
    answers: list[str]
    answer_prefix: str = ""
    shots: tuple[tuple[str, str], ...] = ()
    all_classes: list[str] | None = None
    length: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def user_text(self) -> str:
        """The user message: context followed by the question."""
        return self.context + self.question

    @property
    def prompt(self) -> str:
        """The whole prompt without chat template: shots, context, question and answer prefix."""
        shots = "".join(user + reply + "\n" for user, reply in self.shots)
        return shots + self.context + self.question + self.answer_prefix

    def prompt_end(self, chars: int = 300) -> str:
        """The last ``chars`` characters of :attr:`prompt` (recorded per prediction: the results site's predictions
        browser shows what was asked)."""
        return self.prompt[-chars:]

    def prompt_sha256(self) -> str:
        """Hash of everything the prompt is built from (recorded per prediction; resume checks it)."""
        blob = json.dumps([self.shots, self.context, self.question, self.answer_prefix], ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (:meth:`from_json` inverts it)."""
        return {
            "id": self.id,
            "context": self.context,
            "question": self.question,
            "answers": list(self.answers),
            "answer_prefix": self.answer_prefix,
            "shots": [list(shot) for shot in self.shots],
            "all_classes": self.all_classes,
            "length": self.length,
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sample:
        """Inverse of :meth:`to_json`."""
        fields = dict(data)
        fields["shots"] = tuple((user, reply) for user, reply in fields.get("shots", ()))
        return cls(**fields)
