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

This module also holds the helpers the RULER and NeedleBench generators share: :class:`TextTokenizer` (token
counting / encode / decode with the model's tokenizer) and the input-folder resolution.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
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
# Shared helpers (also used by kvbench.tasks.ruler and kvbench.tasks.needlebench)
# --------------------------------------------------------------------------------------------------------------

_FALLBACK_PIECE = re.compile(r"\s*(?:[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]|\w+|[^\w\s])|\s+$")


class TextTokenizer:
    """Token counting, encoding and decoding with a model's HF tokenizer, never adding special tokens.

    ``tokenizer=None`` falls back to a deterministic word/punctuation splitter (one token per word, punctuation
    mark or CJK character, leading whitespace attached) so that datasets can be built without a model; lengths are
    then approximate and tests should pass a real tokenizer.
    """

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self._pieces: list[str] = []
        self._ids: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS)."""
        if self.tokenizer is not None:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        ids = []
        for piece in _FALLBACK_PIECE.findall(text):
            if piece not in self._ids:
                self._ids[piece] = len(self._pieces)
                self._pieces.append(piece)
            ids.append(self._ids[piece])
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids (special tokens kept, no clean-up of spaces)."""
        if self.tokenizer is not None:
            return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return "".join(self._pieces[i] for i in ids)

    def count(self, text: str) -> int:
        """Number of tokens of ``text`` without special tokens (RULER's ``len(tokenizer.tokenize(text))``)."""
        if self.tokenizer is not None and hasattr(self.tokenizer, "tokenize"):
            return len(self.tokenizer.tokenize(text))
        return len(self.encode(text))

    @cached_property
    def period_ids(self) -> frozenset[int]:
        """Ids whose token is a lone period (the NIAH insertion point snaps to just after one of them)."""
        ids = set(self.encode("."))
        ids.update(self.encode("Yes."))
        ids.update(self.encode("Yes ."))
        return frozenset(i for i in ids if self.decode([i]).strip() == ".")


def option_values(task_cfg: Any, defaults: dict[str, Any], task_name: str) -> dict[str, Any]:
    """``task.options`` merged over ``defaults``; unknown keys raise an error that lists the valid keys."""
    given = dict(getattr(task_cfg, "options", None) or {})
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(
            f"unknown task.options key(s) {unknown} for task {task_name!r}; valid keys: {', '.join(sorted(defaults))}"
        )
    merged = dict(defaults)
    merged.update(given)
    return merged


def resolve_input_dir(task_cfg: Any, benchmark: str, source: str) -> Path | None:
    """Folder with the benchmark's downloaded inputs, or ``None`` to use the shipped fallback inputs.

    ``source``: ``auto`` = ``task.data_dir`` if set, else ``./data/<benchmark>`` if it exists, else shipped inputs;
    ``shipped`` = always the shipped inputs; ``hub`` = download with the registered data preparer into
    ``task.data_dir`` (or ``~/.cache/kvbench/<benchmark>``) first.
    """
    data_dir = getattr(task_cfg, "data_dir", None)
    if source == "shipped":
        return None
    if source == "hub":
        target = Path(data_dir) if data_dir else Path.home() / ".cache" / "kvbench" / benchmark
        from kvbench.tasks.base import data_preparers

        data_preparers()[benchmark](target)
        return target
    if source != "auto":
        raise ValueError(f"task.options.source must be auto, shipped or hub, got {source!r}")
    if data_dir:
        path = Path(data_dir)
        if not path.is_dir():
            raise FileNotFoundError(f"task.data_dir {path} does not exist (use scripts/prepare_data.py)")
        return path
    default = Path("data") / benchmark
    return default if default.is_dir() else None


def shipped_essays() -> list[str]:
    """Our own filler essays (``tasks/needle_grid/essays/*.txt``, sorted), the offline English haystack."""
    files = sorted((SHIPPED_ROOT / "needle_grid" / "essays").glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no shipped essays under {SHIPPED_ROOT / 'needle_grid' / 'essays'}")
    return [f.read_text(encoding="utf-8") for f in files]


def _essay_files(folder: Path) -> list[Path]:
    """Essay ``*.txt`` files of a folder, sorted (a URL list such as RULER's ``PaulGrahamEssays_URLs.txt`` is not an
    essay)."""
    return sorted(f for f in folder.glob("*.txt") if "url" not in f.stem.lower())


def load_essays(input_dir: Path | None, missing: str, how_to_get: str) -> tuple[list[str], dict[str, Any]]:
    """English essays and their provenance record (:mod:`kvbench.tasks.provenance`).

    Looks in ``input_dir`` for, in order: ``PaulGrahamEssays.json`` (RULER, ``{"text": ...}``; also under ``json/``,
    RULER's own layout), ``PaulGrahamEssays.jsonl`` (NeedleBench), ``PaulGrahamEssays/*.txt`` (the gkamradt layout),
    then ``*.txt`` in ``input_dir`` itself.  Without any, the shipped filler essays are a stand-in for ``missing``
    (``how_to_get`` says how to get it).
    """
    if input_dir is not None:
        for js in (input_dir / "PaulGrahamEssays.json", input_dir / "json" / "PaulGrahamEssays.json"):
            if js.is_file():
                data = json.loads(js.read_text(encoding="utf-8"))
                essays = [data["text"]] if isinstance(data, dict) else [d["text"] for d in data]
                return essays, provenance.official(js)
        jsonl = input_dir / "PaulGrahamEssays.jsonl"
        if jsonl.is_file():
            with jsonl.open(encoding="utf-8") as handle:
                return [json.loads(line)["text"] for line in handle if line.strip()], provenance.official(jsonl)
        for folder in (input_dir / "PaulGrahamEssays", input_dir):
            files = _essay_files(folder)
            if files:
                record = _folder_record(folder, files)
                return [f.read_text(encoding="utf-8") for f in files], record
    folder = SHIPPED_ROOT / "needle_grid" / "essays"
    record = _folder_record(folder, _essay_files(folder))
    record.update(source="stand-in", missing=missing, how_to_get=how_to_get)
    return shipped_essays(), record


def _folder_record(folder: Path, files: Sequence[Path]) -> dict[str, Any]:
    """Provenance of a folder of text files: one sha256 over the files' names and hashes."""
    hashes = {f.name: provenance.file_sha256(f) for f in files}
    return {"source": "official", "path": str(folder), "sha256": provenance.digest_of(hashes), "files": len(files)}


def download(url: str, target: Path) -> None:
    """Fetch ``url`` to ``target`` unless it is already there (used by the data preparers)."""
    if target.is_file() and target.stat().st_size > 0:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".part")
    with urllib.request.urlopen(url, timeout=120) as response, tmp.open("wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)
    os.replace(tmp, target)


def hub_download(repo_id: str, filename: str, target_dir: Path) -> Path:
    """Copy one file of a HF dataset repository into ``target_dir`` (uses ``huggingface_hub``)."""
    from huggingface_hub import hf_hub_download

    target_dir.mkdir(parents=True, exist_ok=True)
    return Path(hf_hub_download(repo_id=repo_id, filename=filename, repo_type="dataset", local_dir=target_dir))


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


def plot_needle_heatmap(
    rows: Sequence[dict[str, Any]],
    path: str | Path,
    *,
    title: str | None = None,
    score_key: str = "score",
    vmax: float = 1.0,
) -> Path:
    """Write the needle heatmap PNG (x: context length, y: depth %, colour: mean ``score_key`` per cell).

    ``rows``: dicts with ``length`` (tokens), ``depth`` (percent) and ``score_key`` (0..vmax; the set recall 0-1 by
    default) - e.g. :func:`needle_grid_rows` output or rows read back from a run's predictions.  Cells without data
    are blank.  The title gets the overall score (mean over all cells x 100 / vmax) and the colours use the same
    0-100 scale.  Returns the written path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap

    if not rows:
        raise ValueError("no rows to plot")
    lengths = sorted({int(r["length"]) for r in rows})
    depths = sorted({float(r["depth"]) for r in rows})
    sums = np.zeros((len(depths), len(lengths)))
    counts = np.zeros_like(sums)
    for r in rows:
        i, j = depths.index(float(r["depth"])), lengths.index(int(r["length"]))
        sums[i, j] += float(r[score_key])
        counts[i, j] += 1
    grid = np.divide(sums, counts, out=np.full_like(sums, np.nan), where=counts > 0)
    overall = 100.0 * float(np.nanmean(grid)) / vmax
    shown = 100.0 * grid / vmax  # colours on the title's 0-100 scale

    cmap = LinearSegmentedColormap.from_list("needle", ["#F0496E", "#EBB839", "#0CD79F"])
    width = min(max(6.0, 0.25 * len(lengths) + 3), 24.0)
    fig, ax = plt.subplots(figsize=(width, max(4.0, 0.35 * len(depths) + 2)))
    image = ax.imshow(np.ma.masked_invalid(shown), cmap=cmap, vmin=0.0, vmax=100.0, aspect="auto", origin="upper")
    ax.set_xticks(range(len(lengths)))
    ax.set_xticklabels([str(x) for x in lengths], rotation=90 if len(lengths) > 12 else 0, fontsize=8)
    ax.set_yticks(range(len(depths)))
    ax.set_yticklabels([_fmt(d) for d in depths], fontsize=8)
    ax.set_xlabel("Context length (tokens)")
    ax.set_ylabel("Depth (%)")
    ax.set_title(f"{title + ' | ' if title else ''}Overall score {overall:.2f}")
    fig.colorbar(image, ax=ax, label=score_key if vmax == 100.0 else f"{score_key} × {100.0 / vmax:g}")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


@register_task("needle_grid")
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
