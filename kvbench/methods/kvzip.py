"""KVzip (Kim et al., 2025, arXiv 2505.23416): query-agnostic KV eviction by context reconstruction.

Reproduces NVIDIA/kvpress ``kvpress/presses/kvzip_press.py`` (``KVzipPress``, kvpress 0.5.5, written with the KVzip
authors; the original is snu-mllab/KVzip), which kvbench's tests hold as recordings
(``tests/fixtures/reference/kvzip/``):

1. the prompt is prefilled whole (nothing evicted); its first ``prefix_length`` tokens are the chat template's prefix
   (the text before the user's message, found as kvpress does from the tokenizer's chat template; 0 without one);
2. the rest of the prompt is cut into chunks of ``chunk_size`` tokens; each chunk is *replayed* on top of the
   prompt, at the positions right after it: ``"\\n\\nRepeat the previous context exactly."`` (first chunk) or
   ``"\\n\\nRepeat the part of the previous context exactly, starting with"`` followed by the previous chunk's last 8
   tokens, then the chat template's assistant suffix (``"\\n"`` without a template), then the chunk itself;
3. at every layer, each replayed query's softmax (model dtype, causal among the replay) over the first
   ``min(n_sink, chunk start)`` keys, the chunk's keys and the replay's own keys; a token's score is its largest
   probability over the replay's queries and the KV head's query heads (stored in the model dtype); the replay's
   tokens are then removed from the cache (kvbench's own forward, cache and attention:
   :mod:`kvbench.inference.replay`; the passes are recorded as ``extra_forwards``, their time in the prefill seconds);
4. the first ``n_sink`` tokens get ``max + 1`` of every layer's scores (the prefix past them is never scored: 0,
   evicted first; ``keep_prefix: true`` protects it, as the original protects its system prompt); the lowest
   scores over all layers and heads
   are evicted (``layerwise: false``: kvpress's global choice, so layers and heads keep different numbers), or the
   lowest of each layer (``layerwise: true``, and always under a ``<n>/layer`` budget).

kvpress's ``compression_ratio`` c evicts ``int(L H S c)`` tokens (``int(H S c)`` per layer when layerwise): so does
``budget=<c>cr`` (issue #54); any other budget keeps ``T H`` tokens, ``T`` its total per head over the layers
(``<n>L``: ``n L``).  kvpress masks the evicted
keys (they stay in memory); kvbench removes them.  Not reproduced: ``kvzip_plus_normalization`` (off by default).
Parity: ``tests/methods/test_kvzip.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.nn import functional as F

from kvbench.eviction.base import WindowObservation
from kvbench.eviction.params import bounded
from kvbench.eviction.recipe import ScorerMethod
from kvbench.eviction.wrappers import refuse_prefill_wrappers

FIRST_PROMPT = "\n\nRepeat the previous context exactly."
NEXT_PROMPT = "\n\nRepeat the part of the previous context exactly, starting with"
#: Tokens of the previous chunk repeated after ``NEXT_PROMPT``.
PREVIOUS_TAIL = 8


def chat_template_parts(tokenizer: Any) -> tuple[int, list[int]]:
    """``(prefix_length, suffix_ids)`` as kvpress finds them: the template rendered around a dummy user message, the
    text before it tokenized for its length, the text after it (the assistant turn's opening) as the suffix; without
    a chat template ``(0, ids of "\\n")``."""
    if getattr(tokenizer, "chat_template", None) is None:
        prefix_text, suffix_text = "", "\n"
    else:
        dummy = "dummy context"
        separator = "\n" + "#" * len(dummy)
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": dummy + separator}],
            add_generation_prompt=True,
            tokenize=False,
            enable_thinking=False,
        )
        before, suffix_text = rendered.split(separator)
        prefix_text = before.split(dummy)[0]
    prefix_length = len(tokenizer.encode(prefix_text, add_special_tokens=False))
    return prefix_length, list(tokenizer.encode(suffix_text, add_special_tokens=False))


@dataclass(frozen=True)
class KVzip(ScorerMethod, family="kvzip", reference="NVIDIA/kvpress kvpress/presses/kvzip_press.py@0.5.5"):
    """Scores from the prompt's reconstruction by the model (module docstring)."""

    #: First tokens always kept (scored ``max + 1``) and seen by every replay after the first chunk.
    n_sink: int = bounded(4, 0)
    #: Prompt tokens reconstructed by one replay forward.
    chunk_size: int = bounded(2048, 1)
    #: Every layer evicts the same number (kvpress's ``layerwise``); off: the lowest scores over all layers.
    layerwise: bool = False
    #: Protect the chat template's prefix (the tokens before the replayed context) as the original snu-mllab/KVzip
    #: protects its system prompt; off (kvpress): the prefix past ``n_sink`` is never scored (0) and goes first.
    keep_prefix: bool = False

    #: The session runs :meth:`replay_passes` after the prefill and compresses with :meth:`select`.
    replays_context: ClassVar[bool] = True

    def __post_init__(self) -> None:
        refuse_prefill_wrappers(self, "kvzip", "splits the budget over layers and heads itself")
        if self.decode_interval or self.keep_window:
            raise ValueError("kvzip evicts once after the prefill: decode_interval and keep_window must stay off")

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """Not used: KVzip's scores come from its replay forwards (:meth:`replay_scores`)."""
        raise NotImplementedError("kvzip scores the prompt by replay forwards (kvbench.inference.replay)")

    def replay_passes(self, prompt_ids: list[int], tokenizer: Any) -> list[tuple[list[int], int, int]]:
        """The replay forwards: ``(token ids, start, end)``, each scoring the prompt tokens ``start .. end - 1``."""
        prefix_length, suffix_ids = chat_template_parts(tokenizer)
        context = prompt_ids[prefix_length:]
        chunks = [context[first : first + self.chunk_size] for first in range(0, len(context), self.chunk_size)]
        passes, start = [], prefix_length
        for index, chunk in enumerate(chunks):
            if index == 0:
                lead = tokenizer.encode(FIRST_PROMPT, add_special_tokens=False)
            else:
                lead = tokenizer.encode(NEXT_PROMPT, add_special_tokens=False) + chunks[index - 1][-PREVIOUS_TAIL:]
            passes.append((list(lead) + suffix_ids + chunk, start, start + len(chunk)))
            start += len(chunk)
        return passes

    def replay_scores(self, queries: torch.Tensor, keys: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """``[H, end - start]`` scores of the replayed span at one layer, in the model dtype: the largest replay
        attention (:meth:`replay_attention`) over the replay's queries and the KV head's query heads."""
        return self.replay_attention(queries, keys, start, end).amax(dim=(-3, -2))

    def replay_attention(self, queries: torch.Tensor, keys: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """``[H, G, q, end - start]`` probabilities of each replayed query over the replayed span, in the model dtype.

        ``queries``: ``[H_q, q, D]`` post-RoPE queries of the replay; ``keys``: ``[H, S + q, D]`` the prompt's
        keys, then the replay's.  The softmax runs over the first ``min(n_sink, start)`` keys, the span's and the
        replay's own (causal among the replay).
        """
        heads_q, replay, dim = queries.shape
        heads = keys.shape[0]
        sink = min(self.n_sink, start)
        seen = torch.cat([keys[:, :sink], keys[:, start:end], keys[:, -replay:]], dim=1)  # [H, sink + c + q, D]
        grouped = queries.view(1, heads, heads_q // heads, replay, dim)
        logits = torch.matmul(grouped, seen[None, :, None].transpose(-2, -1).contiguous()) / math.sqrt(dim)
        causal = torch.full((replay, replay), torch.finfo(logits.dtype).min, device=logits.device)
        rows = torch.arange(replay, device=logits.device)
        causal.masked_fill_(rows < (rows + 1).view(replay, 1), 0)
        logits[..., -replay:, -replay:] += causal
        probs = F.softmax(logits, dim=-1)
        return probs[0, ..., sink : sink + end - start]

    def select(
        self,
        scores: list[torch.Tensor],
        kept: int,
        per_layer: int | None,
        prefix: int = 0,
        layer_kept: int | None = None,
    ) -> list[list[torch.Tensor]]:
        """Per layer, per head, the kept token indices (sorted).

        ``scores``: per layer ``[H, S]`` (model dtype); ``kept``: tokens kept over all layers and heads (the budget's
        total per head times ``H``; ``<c>cr``: kvpress's ``L H S - int(L H S c)``); ``per_layer``: tokens kept per
        layer over its heads (a ``<n>/layer`` budget: ``n H``), or ``None``; ``prefix``: the prompt tokens before the
        replayed ones (protected with ``keep_prefix``); ``layer_kept``: with ``layerwise``, each layer's count
        (``<c>cr``: kvpress's ``H S - int(H S c)``; ``None``: ``kept // L``).
        """
        stacked = torch.stack(scores)  # [L, H, S]
        protected = max(self.n_sink, prefix) if self.keep_prefix else self.n_sink
        stacked[..., :protected] = stacked.amax() + 1.0
        return top_scores(stacked, kept, per_layer, self.layerwise, layer_kept)


def top_scores(
    stacked: torch.Tensor, kept: int, per_layer: int | None, layerwise: bool, layer_kept: int | None = None
) -> list[list[torch.Tensor]]:
    """KVzip's selection (kvpress's ``compress_post``): per layer, per head, the sorted indices of the top ``kept``
    of ``stacked`` ``[L, H, S]`` over every layer and head -- each layer then keeping the top of its own heads
    together --, or the top ``kept // L`` (``per_layer``, when given; ``layer_kept``: kvpress's own count of a layer
    under ``<c>cr``) of each layer (``layerwise``)."""
    layers, heads, length = stacked.shape
    if per_layer is not None or layerwise:
        count = per_layer if per_layer is not None else layer_kept if layer_kept is not None else kept // layers
        counts = [min(count, heads * length)] * layers
    else:
        order = torch.argsort(stacked.reshape(-1).float(), descending=True, stable=True)[:kept]
        counts = torch.bincount(order // (heads * length), minlength=layers).tolist()
    kept_per_layer = []
    for layer, count in enumerate(counts):
        order = torch.argsort(stacked[layer].reshape(-1).float(), descending=True, stable=True)[: int(count)]
        head_of, token_of = order // length, order % length
        kept_per_layer.append([torch.sort(token_of[head_of == head]).values for head in range(heads)])
    return kept_per_layer
