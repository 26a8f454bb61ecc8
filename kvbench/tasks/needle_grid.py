"""Classic needle-in-a-haystack grid (``task=needle_grid``), as run by PyramidKV / KVCache-Factory and Ada-KV [000].

Protocol (shared/specs/benchmarks.md section 4.2):

* haystack: essays concatenated in sorted file order and repeated until long enough, tokenised with the model's
  tokenizer (no special tokens), cut to ``context_length`` tokens;
* needle ``"\\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\\n"``
  inserted at ``depth`` percent of the context after reserving a 200-token buffer: the context is cut to
  ``context_length - 200 - len(needle)`` tokens, the insertion point ``int(len * depth / 100)`` walks back to just
  after the previous period token (depth 100 appends);
* prompt (no chat template): ``<|im_start|> This is a very long story book: <book> {context} </book>.\\n Based on the
  content of the book, Question: {retrieval_question}\\nAnswer:`` with ``retrieval_question = "The best thing to do
  in San Francisco is: "``; greedy, 30 new tokens, stops at a newline;
* scores: the heatmap word-set recall (0-1; dataset headline = mean x 100) and the stored ROUGE-1 F x 10.

Grid: ``task.lengths`` (else ``options.s_len..options.e_len`` by ``options.step``, the scripts' Llama-3 default
1000..8000 step 100) x ``task.depths`` (else ``np.round(np.linspace(0, 100, 10))`` = 0, 11, ..., 100).

The helpers the needle grid shares with the RULER and NeedleBench generators (:class:`TextTokenizer`, the
input-folder resolution, essay loading) live in :mod:`kvbench.tasks.text_inputs`.
"""

from __future__ import annotations

import json
import logging
import math
import urllib.request
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from kvbench import resources
from kvbench.metrics.synthetic import needle_rouge_score, needle_set_recall
from kvbench.tasks import provenance
from kvbench.tasks.base import Sample, TaskDataset, register_data_preparer, register_task, select_datasets
from kvbench.tasks.text_inputs import TextTokenizer, download, load_essays, option_values, resolve_input_dir
from kvbench.views.needle_heatmap import plot_needle_heatmap

log = logging.getLogger(__name__)

#: Folder with the redistributable inputs we ship (``tasks/<benchmark>/``; see :mod:`kvbench.resources`).
SHIPPED_ROOT = resources.tasks_dir()

NEEDLE = "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
RETRIEVAL_QUESTION = "The best thing to do in San Francisco is: "
PROMPT_HEAD = "<|im_start|> This is a very long story book: <book> "
PROMPT_MIDDLE = " </book>.\n"
PROMPT_QUESTION = " Based on the content of the book, Question: {question}\nAnswer:"
FINAL_CONTEXT_LENGTH_BUFFER = 200
MAX_NEW_TOKENS = 30

_OPTION_DEFAULTS: dict[str, Any] = {
    "s_len": 1000,
    "e_len": 8001,
    "step": 100,
    "buffer": FINAL_CONTEXT_LENGTH_BUFFER,
    "max_new_tokens": MAX_NEW_TOKENS,
    "source": "auto",
    "needle": NEEDLE,
    "retrieval_question": RETRIEVAL_QUESTION,
}


# --------------------------------------------------------------------------------------------------------------
# The needle grid
# --------------------------------------------------------------------------------------------------------------


def default_depths() -> list[float]:
    """``np.round(np.linspace(0, 100, 10)).astype(int)`` = 0, 11, 22, 33, 44, 56, 67, 78, 89, 100."""
    return [float(d) for d in np.round(np.linspace(0, 100, 10)).astype(int)]


class NeedleGridDataset(TaskDataset):
    """All (context length, depth) cells of the needle grid; one sample per cell, lengths outer, depths inner."""

    name = "needle_grid"
    chat_template = False
    stop_strings = ("\n",)
    metric_name = "needle_set_recall"

    def __init__(
        self,
        tokenizer: Any,
        essays: Sequence[str],
        lengths: Sequence[int],
        depths: Sequence[float],
        *,
        needle: str = NEEDLE,
        retrieval_question: str = RETRIEVAL_QUESTION,
        buffer: int = FINAL_CONTEXT_LENGTH_BUFFER,
        max_new_tokens: int = MAX_NEW_TOKENS,
        num_samples: int | None = None,
        haystack_source: dict[str, Any] | None = None,
    ) -> None:
        self.tok = TextTokenizer(tokenizer)
        self.essays = list(essays)
        self.lengths = [int(x) for x in lengths]
        self.depths = [float(d) for d in depths]
        self.needle = needle
        self.retrieval_question = retrieval_question
        self.buffer = buffer
        self.max_new_tokens = max_new_tokens
        self.num_samples = num_samples
        self.haystack_source = haystack_source or provenance.generated("caller-provided essays")
        self._samples: list[Sample] | None = None

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(lengths=self.lengths, depths=self.depths, buffer=self.buffer)
        return info

    def provenance(self) -> dict[str, dict[str, Any]]:
        return {"essays": self.haystack_source}

    @cached_property
    def _unit_tokens(self) -> list[int]:
        """Tokens of all essays concatenated once."""
        unit = self.tok.encode("".join(self.essays))
        if not unit:
            raise ValueError("empty haystack")
        return unit

    @cached_property
    def _period_ids(self) -> frozenset[int]:
        """Lone-period token ids: the tokenizer's own plus every haystack token that decodes to "."."""
        found = {i for i in set(self._unit_tokens) if self.tok.decode([i]).strip() == "."}
        return self.tok.period_ids | frozenset(found)

    def _haystack_tokens(self, needed: int) -> list[int]:
        """Essay tokens, concatenated (and repeated) until at least ``needed`` tokens, cut to ``needed``."""
        unit = self._unit_tokens
        return (unit * math.ceil(needed / len(unit)))[:needed]

    def build_context(self, context_length: int, depth: float) -> tuple[str, int]:
        """The haystack with the needle for one cell: (text, needle start in tokens of that text)."""
        tokens_context = self._haystack_tokens(context_length)
        tokens_needle = self.tok.encode(self.needle)
        budget = context_length - self.buffer
        if len(tokens_context) + len(tokens_needle) > budget:
            tokens_context = tokens_context[: max(budget - len(tokens_needle), 0)]
        if depth >= 100:
            point = len(tokens_context)
        else:
            point = int(len(tokens_context) * (depth / 100))
            periods = self._period_ids
            while point > 0 and tokens_context[point - 1] not in periods:
                point -= 1
        new_tokens = tokens_context[:point] + tokens_needle + tokens_context[point:]
        return self.tok.decode(new_tokens), point

    def samples(self) -> list[Sample]:
        if self._samples is None:
            out: list[Sample] = []
            for length in self.lengths:
                for depth in self.depths:
                    if self.num_samples is not None and len(out) >= self.num_samples:
                        break
                    text, point = self.build_context(length, depth)
                    context = PROMPT_HEAD + text + PROMPT_MIDDLE
                    question = PROMPT_QUESTION.format(question=self.retrieval_question)
                    haystack_tokens = self.tok.count(text)
                    out.append(
                        Sample(
                            id=f"L{length}_D{_fmt(depth)}",
                            context=context,
                            question=question,
                            answers=[self.needle.strip()],
                            extra={
                                "context_length": length,
                                "depth": depth,
                                "needle_token_start": point,
                                "haystack_tokens": haystack_tokens,
                                "actual_depth": 100.0 * point / max(haystack_tokens, 1),
                                "prompt_tokens": self.tok.count(context + question),
                            },
                        )
                    )
            self._samples = out
        return self._samples

    def postprocess(self, prediction: str) -> str:
        return prediction.strip()

    def write_report(self, predictions: Sequence[str], samples: Sequence[Sample], folder: Path, title: str) -> None:
        """The needle heatmap (depth x context length, set recall) as ``heatmap.png``."""
        plot_needle_heatmap(needle_grid_rows(predictions, samples), folder / "heatmap.png", title=title)

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        """``score`` = mean set recall x 100; ``rouge1_x10`` = mean ROUGE-1 F x 10; ``length_{L}`` per length."""
        rows = needle_grid_rows(predictions, samples)
        if not rows:
            return {"score": 0.0, "rouge1_x10": 0.0}
        result = {
            "score": 100.0 * float(np.mean([r["score"] for r in rows])),
            "rouge1_x10": float(np.mean([r["rouge1_x10"] for r in rows])),
            "recall_legacy": 100.0 * float(np.mean([r["recall_legacy"] for r in rows])),
        }
        for length in sorted({r["length"] for r in rows}):
            cell = [r["score"] for r in rows if r["length"] == length]
            result[f"length_{length}"] = 100.0 * float(np.mean(cell))
        return result


def needle_grid_rows(predictions: Sequence[str], samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """Per-sample rows ``{"length", "depth", "score" (set recall 0-1), "recall_legacy", "rouge1_x10"}``."""
    if len(predictions) != len(samples):
        raise ValueError(f"{len(predictions)} predictions for {len(samples)} samples")
    rows = []
    for prediction, sample in zip(predictions, samples, strict=True):
        needle = sample.answers[0] if sample.answers else NEEDLE.strip()
        rows.append(
            {
                "length": int(sample.extra["context_length"]),
                "depth": float(sample.extra["depth"]),
                "score": needle_set_recall(prediction),
                "recall_legacy": needle_set_recall(prediction, legacy=True),
                "rouge1_x10": needle_rouge_score(needle, prediction),
            }
        )
    return rows


def _dataset_names(task: Any) -> list[str]:
    """The one dataset of a needle grid (:data:`~kvbench.tasks.base.DatasetNames`)."""
    return [NeedleGridDataset.name]


@register_task("needle_grid", dataset_names=_dataset_names)
def build_needle_grid(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """Builder: one dataset ``needle_grid`` over the configured length x depth grid."""
    opts = option_values(task_cfg, _OPTION_DEFAULTS, "needle_grid")
    select_datasets([NeedleGridDataset.name], getattr(task_cfg, "datasets", None), "needle_grid")
    lengths = getattr(task_cfg, "lengths", None)
    if not lengths:
        length = getattr(task_cfg, "length", None)
        lengths = [length] if length else list(range(int(opts["s_len"]), int(opts["e_len"]), int(opts["step"])))
    depths = getattr(task_cfg, "depths", None) or default_depths()
    if any(not 0 <= float(d) <= 100 for d in depths):
        raise ValueError(f"needle depths must be in [0, 100], got {list(depths)}")
    if any(int(x) <= int(opts["buffer"]) for x in lengths):
        raise ValueError(f"every context length must exceed the {opts['buffer']}-token buffer, got {list(lengths)}")
    input_dir = resolve_input_dir(task_cfg, "needle_grid", opts["source"])
    essays, where = load_essays(
        input_dir,
        missing="PaulGrahamEssays/*.txt (the 49 gkamradt essays)",
        how_to_get="python scripts/prepare_data.py needle_grid --out data  (then task.data_dir=data/needle_grid)",
    )
    return [
        NeedleGridDataset(
            tokenizer,
            essays,
            lengths,
            depths,
            needle=opts["needle"],
            retrieval_question=opts["retrieval_question"],
            buffer=int(opts["buffer"]),
            max_new_tokens=int(opts["max_new_tokens"]),
            num_samples=getattr(task_cfg, "num_samples", None),
            haystack_source=where,
        )
    ]


#: gkamradt/LLMTest_NeedleInAHaystack at the commit the spec read; the essays are the 49 .txt files there.
_GKAMRADT_API = (
    "https://api.github.com/repos/gkamradt/LLMTest_NeedleInAHaystack/contents/needlehaystack/PaulGrahamEssays"
)


@register_data_preparer("needle_grid")
def prepare_needle_grid(target_dir: Path, **options: Any) -> None:
    """Download the 49 Paul Graham essays of gkamradt's NIAH repository to ``target_dir/PaulGrahamEssays/*.txt``.

    Options: ``api_url`` (GitHub contents API listing of the folder).
    """
    listing_url = options.get("api_url", _GKAMRADT_API)
    with urllib.request.urlopen(listing_url, timeout=60) as response:
        entries = json.loads(response.read().decode("utf-8"))
    folder = Path(target_dir) / "PaulGrahamEssays"
    for entry in entries:
        if entry.get("name", "").endswith(".txt") and entry.get("download_url"):
            download(entry["download_url"], folder / entry["name"])


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
