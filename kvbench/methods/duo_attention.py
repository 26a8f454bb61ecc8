"""DuoAttention (Xiao et al., arXiv 2410.10819): retrieval heads keep every token, streaming heads sinks + recent.

Reproduces the kept tokens of mit-han-lab/duo-attention (``duo_attn/utils.py``: ``load_attn_pattern``,
``sparsify_attention_heads``; ``duo_attn/patch/llama.py``'s streaming cache: the first ``sink_size`` and the last
``recent_size`` tokens once a streaming head holds more than both) and, with ``params.selection: kvpress``, of
NVIDIA/kvpress 0.5.5's ``DuoAttentionPress``:

* Pattern: the released format, a folder with ``full_attention_heads.tsv`` (``[layers, kv_heads]`` gate values,
  tab-separated; clipped to ``[0, 1]`` on loading) and ``config.json`` (``sink_size``, ``recent_size``), as in the
  repository's ``attn_patterns/<model>/<run>/``.  ``params.pattern`` is that folder, downloaded on the user's machine
  (absolute, relative to the working directory, or to kvbench's shipped files).  A model without one:
  ``scripts/estimate_duo_pattern.py`` writes a folder in this format with kvbench's proxy estimate (its docstring
  says how it relates to the paper's optimisation).  The default is the pattern shipped for the embedded tiny
  model (``models/head_patterns/tiny-niah/duo_attention``, estimated by that script).
* Head selection (``params.sparsity`` s, the fraction of streaming heads; the original's ``--sparsity``, default 0.5):
  ``quantile`` (the original, default): a tie-breaking noise ``uniform(0, 1e-6)`` drawn from numpy's legacy
  generator seeded ``params.tie_noise_seed`` (42: ``eval/LongBench/pred.py``'s ``seed_everything(42)``; null: none)
  is added to the gates, then the heads whose gate is ``>= quantile(gates, s)`` are retrieval heads (all when
  ``s <= 0``, none when ``s >= 1``).  ``kvpress``: the ``round(N s)`` heads of lowest gate (``np.argsort`` over the
  flattened pattern) are streaming heads, no noise.  The two differ where the quantile falls between tied gates.
* Budget semantics: the budget (tokens per head of the layer) is **what a streaming head keeps**: the pattern's
  ``sink_size`` sinks (at most the budget) and ``budget - sinks`` recent tokens, unless ``params.sink_size`` /
  ``params.recent_size`` set them (the reference's ``--sink_size`` / ``--recent_size``; then the budget is not
  read for that size).  Retrieval heads keep all ``S`` tokens, so a layer's mean cache is
  ``(1 - s) S + s (sinks + recent)`` per head, above the budget: the run records it (``achieved_per_head``).  A
  streaming head holding at most ``sinks + recent`` tokens keeps them all.
* Phases: prefill only by default, as kvpress (which masks the streaming heads' middle tokens after the prefill
  and keeps every generated token).  ``method.params.decode_eviction: true`` is the original's streaming cache while
  decoding (and after a question appended in question-agnostic mode): every streaming head keeps rolling its sinks +
  recent tokens (the oldest non-sink goes), retrieval heads keep growing.  Not reproduced: the original's streaming
  heads also attend with their sink + recent mask *during* the prefill (blocksparse / chunked), so later layers see
  other hidden states; kvbench evicts once after a full prefill.
* The pattern is per KV head: ``method.params.gqa_granularity`` must be ``kv_head``.  The pattern must have the model's
  shape (compressible layers x KV heads); a mismatch is an error naming both.

Parity: ``tests/methods/test_duo_attention.py`` (recordings ``tests/fixtures/reference/heads/DuoAttention.json``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from kvbench.eviction.base import EvictionMethod, TokenScorer, WindowObservation, common_knobs
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.kept_sets import HeadFileMismatch, KeepScoredTokens, files_digest, keep_only, resolve_data_path
from kvbench.eviction.params import bounded, choice
from kvbench.eviction.state import DecodeState
from kvbench.methods.streamingllm import SinkWindowDecode

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer

SELECTIONS = ("quantile", "kvpress")
PATTERN_FILES = ("full_attention_heads.tsv", "config.json")
ESTIMATE_HINT = (
    "give method.params.pattern=<folder with full_attention_heads.tsv and config.json> (mit-han-lab/duo-attention's "
    "attn_patterns/<model>/<run>/, downloaded on your machine), or estimate one with "
    "`python scripts/estimate_duo_pattern.py --model <model> --probes <probes.jsonl> --out <folder>`"
)


@dataclass(frozen=True)
class DuoPattern:
    """A loaded pattern: gates ``[layers, kv_heads]`` clipped to ``[0, 1]``, and the config's sizes."""

    gates: np.ndarray
    sink_size: int
    recent_size: int
    source: str
    sha256: str


def load_duo_pattern(path: str) -> DuoPattern:
    """Read a pattern folder in the released format (module docstring), as ``duo_attn.utils.load_attn_pattern``."""
    folder = resolve_data_path(path, "method.params.pattern", ESTIMATE_HINT)
    missing = [name for name in PATTERN_FILES if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"method.params.pattern {path!r}: {folder} lacks {missing}; {ESTIMATE_HINT}")
    try:
        gates = np.loadtxt(folder / "full_attention_heads.tsv", dtype=float, delimiter="\t", ndmin=2)
        config = json.loads((folder / "config.json").read_text())
        sink, recent = int(config["sink_size"]), int(config["recent_size"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"method.params.pattern {path!r}: unreadable pattern ({err}); {ESTIMATE_HINT}") from None
    if gates.size == 0:
        raise ValueError(f"method.params.pattern {path!r}: full_attention_heads.tsv holds no gate; {ESTIMATE_HINT}")
    digest = files_digest(*(folder / name for name in PATTERN_FILES))
    return DuoPattern(np.clip(gates, 0, 1), sink, recent, str(folder), digest)


def retrieval_heads(gates: np.ndarray, sparsity: float, selection: str, tie_noise_seed: int | None) -> np.ndarray:
    """``[layers, kv_heads]`` bool: which heads keep every token (module docstring's two rules)."""
    if selection == "kvpress":
        streaming = np.zeros(gates.shape, dtype=bool)
        count = round(gates.size * sparsity)
        if count > 0:
            streaming[np.unravel_index(np.argsort(gates, axis=None)[:count], gates.shape)] = True
        return ~streaming
    noisy = gates.astype(float)
    if tie_noise_seed is not None:
        noisy = noisy + np.random.RandomState(tie_noise_seed).uniform(0, 1e-6, gates.shape)
    threshold = np.quantile(noisy, sparsity)
    if sparsity >= 1:
        threshold = 2
    if sparsity <= 0:
        threshold = -1
    return noisy >= threshold


def streaming_keep(length: int, sinks: int, recent: int) -> torch.Tensor:
    """``[S]`` bool: the first ``sinks`` and last ``recent`` tokens, or all when ``S <= sinks + recent``."""
    positions = torch.arange(length)
    if length <= sinks + recent:
        return torch.ones(length, dtype=torch.bool)
    return (positions < sinks) | (positions >= length - recent)


class DuoAttentionScorer(TokenScorer):
    """Retrieval heads keep all, streaming heads sinks + recent (kept sets as scores, :mod:`kept_sets`)."""

    def __init__(self, retrieval: np.ndarray, sink_size: int | None, recent_size: int | None, source: str) -> None:
        self.retrieval = torch.as_tensor(retrieval, dtype=torch.bool)
        self.sink_size = sink_size
        self.recent_size = recent_size
        self.source = source

    def streaming_sizes(self, layer_budget: int | None, length: int) -> tuple[int, int]:
        """(sinks, recent) of a streaming head: the set sizes, else the budget split (module docstring)."""
        budget = length if layer_budget is None else int(layer_budget)
        sinks = min(self.sink_size, budget) if self.recent_size is None else self.sink_size
        recent = max(budget - sinks, 0) if self.recent_size is None else self.recent_size
        return sinks, recent

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H_kv, S]``: :data:`RETRIEVAL_SCORE` on a retrieval head's tokens, 1 on a streaming head's kept ones,
        ``-inf`` on its dropped middle (the decode policy tells the heads apart by these scores)."""
        layers, heads = self.retrieval.shape
        if (observation.num_layers, observation.num_heads) != (layers, heads):
            raise HeadFileMismatch(
                f"DuoAttention pattern {self.source} is {layers} layers x {heads} KV heads; the model has "
                f"{observation.num_layers} compressible layers x {observation.num_heads} stored heads. {ESTIMATE_HINT}"
            )
        length = observation.context_length
        sinks, recent = self.streaming_sizes(observation.layer_budget, length)
        keep = streaming_keep(length, sinks, recent).to(observation.keys.device)
        retrieval = self.retrieval[observation.layer_idx].to(observation.keys.device)
        kept = retrieval[:, None] | keep[None, :]
        scores = torch.where(retrieval[:, None], RETRIEVAL_SCORE, 1.0).expand(heads, length)
        return keep_only(scores.to(observation.keys.device), kept)


#: The score of every token of a retrieval head (a streaming head's kept tokens score 1).
RETRIEVAL_SCORE = 2.0
#: A retrieval head's decode cap: it is never cut.
UNCAPPED = 2**62


class StreamingHeadsDecode(SinkWindowDecode):
    """The original's streaming cache while decoding (``params.decode_eviction``): a streaming head keeps its sinks
    + recent tokens, a retrieval head everything.  The heads are told apart by the prefill scores of their kept
    tokens (:data:`RETRIEVAL_SCORE`)."""

    def __init__(self, sink_size: int, recent_size: int | None) -> None:
        super().__init__(sink_size)
        self.recent_size = recent_size

    def start_layer(
        self,
        state: DecodeState,
        layer_idx: int,
        layer: HeadwiseLayer,
        head_budgets: list[int],
        scores: list[torch.Tensor] | None = None,
    ) -> None:
        """Caps: a streaming head its sinks + recent (the set sizes, else its prefill cap: the budget), a retrieval
        head :data:`UNCAPPED`; a layer the prefill did not score keeps its caps."""
        caps = list(head_budgets)
        for head, kept in enumerate(scores or []):
            if kept.numel() and bool((kept == RETRIEVAL_SCORE).all()):
                caps[head] = UNCAPPED
            elif self.recent_size is not None:
                caps[head] = self.sink_tokens + self.recent_size
        super().start_layer(state, layer_idx, layer, caps, scores)


@dataclass(frozen=True)
class DuoAttention(FamilyMethod, family="duo_attention"):
    """DuoAttention's knobs (module docstring)."""

    #: The pattern decides every kept token: no observation window, no GQA reduction.
    unused_knobs: ClassVar[frozenset[str]] = frozenset({"window", "gqa_agg"})

    #: Pattern folder in the released format (``full_attention_heads.tsv`` + ``config.json``).
    pattern: str = "models/head_patterns/tiny-niah/duo_attention"
    #: Fraction of streaming heads (the original's ``--sparsity``; kvpress's ``head_compression_ratio``).
    sparsity: float = bounded(0.5, 0.0, 1.0)
    #: ``quantile`` (the original's ``sparsify_attention_heads``) or ``kvpress`` (``DuoAttentionPress``'s count).
    selection: str = choice("quantile", SELECTIONS)
    #: Seed of the original's tie-breaking noise (numpy legacy generator); null: no noise.
    tie_noise_seed: int | None = 42
    #: Sinks of a streaming head; null: the pattern's ``sink_size`` (at most the budget).
    sink_size: int | None = bounded(None, 0)
    #: Recent tokens of a streaming head; null: the budget minus the sinks.
    recent_size: int | None = bounded(None, 0)

    def build(self, method_cfg: Any) -> EvictionMethod:
        """Retrieval heads from the pattern, streaming heads sinks + recent (module docstring)."""
        if str(self.gqa_granularity) != "kv_head":
            raise ValueError(
                f"method.params.gqa_granularity={self.gqa_granularity!r}: DuoAttention's pattern is per KV head; "
                "valid: kv_head"
            )
        pattern = load_duo_pattern(self.pattern)
        retrieval = retrieval_heads(pattern.gates, self.sparsity, self.selection, self.tie_noise_seed)
        sink = pattern.sink_size if self.sink_size is None else self.sink_size
        scorer = DuoAttentionScorer(retrieval, sink, self.recent_size, pattern.source)
        settings = {
            "pattern": self.pattern,
            "pattern_sha256": pattern.sha256,
            "sparsity": self.sparsity,
            "selection": self.selection,
            "tie_noise_seed": self.tie_noise_seed,
            "sink_size": sink,
            "recent_size": self.recent_size,
            "retrieval_heads": int(retrieval.sum()),
            "heads": int(retrieval.size),
        }
        policy = StreamingHeadsDecode(sink, self.recent_size) if self.decode_eviction else None
        return EvictionMethod(
            scorer=scorer,
            head_allocator=KeepScoredTokens(),
            decode_policy=policy,
            settings=settings,
            ignored_knobs=IGNORED_KNOBS,
            **{**common_knobs(method_cfg, self), "keep_window": False},
        )


#: Position alone decides: no attention statistics, pooling, GQA reduction or window.
IGNORED_KNOBS = frozenset({"window", "gqa_agg"})
