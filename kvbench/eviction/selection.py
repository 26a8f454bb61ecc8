"""Selection wrappers over any scorer (issue #43 item 5): which tokens a layer keeps, given any method's scores.

A scorer method picks, per head, the top ``k`` tokens of its scores (``selection: topk``, the default).  The wrappers
here replace that top-k by NVIDIA/kvpress's wrapper presses (kvpress 0.5.5), over whatever the wrapped method
scores (``method=knorm method.params.selection=chunkkv``):

* ``chunkkv`` -- ``ChunkKVPress`` (Liu et al., 2025, ChunkKV): the context is cut into chunks of
  ``selection_length`` tokens (the last one shorter); a chunk's score is the wrapped scores summed over the KV heads
  then averaged over the chunk's tokens; the best ``max(1, floor(n_chunks k / S))`` whole chunks are kept, the same
  tokens on every head.  kvpress keeps ``max(1, int(n_chunks (1 - ratio)))`` chunks: so does ``budget=<c>cr``
  (kvbench reads c, :attr:`WindowObservation.compression_ratio`); under another budget ``k`` the count is
  ``max(1, floor(n_chunks k / S))``, kvpress's wherever ``S (1 - ratio)`` is a whole number.  A layer keeps whole
  chunks, possibly fewer (or, with the short last chunk, a few more) tokens than ``k``.  A
  context shorter than one chunk falls back to the wrapped method's per-head top-``k``.
* ``chunk`` -- ``ChunkPress``: each chunk of ``selection_length`` tokens is scored on its own (the scorer sees only
  the chunk's keys and values) and keeps its own per-head top ``max(1, floor(len(chunk) k / S))`` (``<c>cr``:
  kvpress's ``max(1, int(len(chunk) (1 - c)))``).
* ``block`` -- ``BlockPress`` (KeyDiff's block-wise prefill, simulated): the head starts from the first ``k`` tokens;
  each next block of ``selection_length`` tokens joins them, the scorer scores the ``k + block`` candidates (their
  keys and values only), and the head keeps the top ``k``.  Over a window scorer (SnapKV) the candidates are scored
  as kvpress's press scores them: with their own queries (:func:`block_queries`) and the candidate set's last
  ``window`` scored ``max + 1`` (no window kept on top of the blocks).

``selection_length`` 0 takes kvpress's default: chunkkv 20, chunk 1024, block 128.  The scorer inside ``chunk`` and
``block`` sees the candidates' keys and values (scorers that read only keys and values, such as knorm and keydiff,
see exactly what kvpress's do) and, over a window scorer, the candidates' own queries as kvpress's ``ChunkPress`` and
``BlockPress`` build them from their hidden states (:func:`block_queries`).

How it composes: :class:`SelectionScorer` wraps the method's scorer and returns its scores where a token is kept and
``-inf`` elsewhere; :class:`SelectedCountAllocator` gives each head as many tokens as it has finite scores.  The
wrapper takes over the method's protection (the window when ``keep_window``, the ``sink_tokens``): ``chunkkv`` scores
them ``max + 1`` before chunking (kvpress pads a press's window so), ``chunk`` and ``block`` pad a window
scorer's window of each chunk or block so and keep the sinks (and another method's window) on top.  The
wrappers set their own per-head counts, so they do not combine with ``allocation: ada``.  The layer budget ``k`` is
the one the layer allocator set (:attr:`WindowObservation.layer_budget`); unknown, nothing is cut.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kvbench.eviction.base import (
    EvictionMethod,
    HeadBudgetAllocator,
    PromptRows,
    TokenScorer,
    WindowObservation,
)
from kvbench.eviction.prerope import GatheredStates, prerope_states, rotate_half
from kvbench.eviction.token_scores import aggregate_groups

#: ``method.params.selection``: the per-head top-k (no wrapper) and the kvpress selection wrappers.
SELECTIONS = ("topk", "chunkkv", "chunk", "block")
#: kvpress's default length of each selection (``selection_length: 0``).
DEFAULT_LENGTH = {"chunkkv": 20, "chunk": 1024, "block": 128}


class SelectedCountAllocator(HeadBudgetAllocator):
    """Each head keeps the tokens its (wrapped) scores did not set to ``-inf``: the selection wrapper's count."""

    def allocate(self, scores: torch.Tensor, budget_per_head: int) -> list[int]:
        return [int(count) for count in (scores > float("-inf")).sum(dim=1).tolist()]


@dataclass(frozen=True)
class SelectionScorer(TokenScorer):
    """The wrapped scorer's ``[H, S]`` scores (GQA groups reduced by ``gqa_agg``) on the selected tokens, ``-inf`` on
    the others (module docstring).

    The wrapper protects what the method protects (the window when it keeps it, and the sinks): for ``chunkkv``
    they score ``max + 1`` before chunking, as kvpress pads a press's window; ``chunk`` and ``block`` keep them on top
    of their selection."""

    inner: TokenScorer
    selection: str
    length: int
    gqa_agg: str = "mean"
    window: int = 0
    sink_tokens: int = 0

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """The wrapped scorer's; ``block`` over a window scorer also the layer's hidden states (:func:`block_queries`
        projects them; asking for the pre-RoPE keys is what makes the session keep them)."""
        rows = self.inner.prompt_rows(model_dtype)
        return (
            dataclasses.replace(rows, prerope_keys=True) if self.selection != "chunkkv" and self.pads_window else rows
        )

    @property
    def pads_window(self) -> bool:
        """Whether ``chunk`` and ``block`` score each chunk or block as kvpress's window press does (a window scorer
        that keeps its window): the tokens' own queries, their last ``window`` scored ``max + 1``."""
        return bool(self.window) and self.inner.window_scorer

    def _scores(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` the wrapped scores, per stored head, in the dtype the scorer computed them in."""
        return aggregate_groups(self.inner.score(observation), observation.num_heads, self.gqa_agg)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        length = observation.context_length
        budget = observation.layer_budget
        scores = self._scores(observation)
        if budget is None or budget >= length:
            return scores
        ratio = observation.compression_ratio
        if self.selection == "chunkkv":
            keep = self._chunkkv(self._padded(scores), budget, ratio)
        else:  # a window scorer's window is padded inside each chunk or block (kvpress's press over a window press)
            protected = protected_tokens(
                length, 0 if self.pads_window else self.window, self.sink_tokens, scores.device
            )
            if self.selection == "chunk":
                keep = self._chunked(observation, budget, ratio) | protected
            else:
                keep = self._blockwise(observation, budget) | protected
        return torch.where(keep, scores.float(), float("-inf"))

    def _protected(self, scores: torch.Tensor) -> torch.Tensor:
        return protected_tokens(scores.shape[1], self.window, self.sink_tokens, scores.device)

    def _padded(self, scores: torch.Tensor) -> torch.Tensor:
        return pad_protected(scores, self.window, self.sink_tokens)

    def _chunkkv(self, scores: torch.Tensor, budget: int, ratio: float | None = None) -> torch.Tensor:
        """``[H, S]`` bool: the best whole chunks, the same on every head (``ratio``: kvpress's compression ratio,
        whose count of chunks is ``max(1, int(n_chunks (1 - ratio)))``; ``None``: from ``budget``)."""
        heads, length = scores.shape
        full, rest = divmod(length, self.length)
        if full == 0:  # no complete chunk: the wrapped method's own top-k per head
            return _topk_mask(scores, budget)
        summed = scores.sum(dim=0)  # over the KV heads, then the mean over each chunk (kvpress's order)
        chunk_scores = summed[: full * self.length].view(full, self.length).mean(dim=-1)
        if rest:
            chunk_scores = torch.cat([chunk_scores, summed[-rest:].mean(dim=-1, keepdim=True)])
        n_chunks = full + (1 if rest else 0)
        kept_chunks = chunk_scores.topk(share(n_chunks, budget, length, ratio)).indices
        chunk_of = torch.arange(length, device=scores.device) // self.length
        keep = torch.isin(chunk_of, kept_chunks.to(chunk_of.device))
        return keep[None].expand(heads, length)

    def _chunked(self, observation: WindowObservation, budget: int, ratio: float | None = None) -> torch.Tensor:
        """``[H, S]`` bool: each chunk's own per-head top ``max(1, floor(len k / S))`` of its own scores
        (``ratio``: kvpress's ``max(1, int(len (1 - ratio)))``)."""
        length = observation.context_length
        keep = torch.zeros(observation.num_heads, length, dtype=torch.bool, device=observation.keys.device)
        for start in range(0, length, self.length):
            end = min(start + self.length, length)
            positions = torch.arange(start, end, device=keep.device).expand(keep.shape[0], -1)
            keep[:, start:end] = _topk_mask(
                self._part_scores(observation, positions), share(end - start, budget, length, ratio)
            )
        return keep

    def _part_scores(self, observation: WindowObservation, positions: torch.Tensor) -> torch.Tensor:
        """``[H, n]`` the wrapped scores of the tokens ``positions`` ``[H, n]`` alone (their keys and values); a window
        scorer's as kvpress's press scores them (:attr:`pads_window`: their own queries, their last ``window``
        scored ``max + 1``)."""
        part = _candidates(observation, positions)
        if not self.pads_window:
            return self._scores(part)
        part.queries = block_queries(observation, positions, self.window)
        return pad_protected(self._scores(part), self.window, 0)

    def _blockwise(self, observation: WindowObservation, budget: int) -> torch.Tensor:
        """``[H, S]`` bool: the top ``budget`` kept through blocks of ``length`` candidates joining the kept set."""
        heads, length = observation.num_heads, observation.context_length
        device = observation.keys.device
        block = min(self.length, length)
        kept = torch.arange(budget, device=device).expand(heads, -1)
        for start in range(budget, length, block):
            new = torch.arange(start, min(start + block, length), device=device).expand(heads, -1)
            candidates = torch.cat([kept, new], dim=-1)
            scores = self._part_scores(observation, candidates)
            kept = candidates.gather(-1, scores.topk(budget, dim=-1).indices)
        keep = torch.zeros(heads, length, dtype=torch.bool, device=device)
        return keep.scatter(-1, kept, True)


def share(count: int, budget: int, length: int, ratio: float | None) -> int:
    """The share of ``count`` (chunks, or a chunk's tokens) a layer keeping ``budget`` of ``length`` tokens keeps:
    kvpress's ``max(1, int(count (1 - ratio)))`` when its compression ratio is known (a ``<c>cr`` budget), else
    ``max(1, floor(count budget / length))`` (the same wherever ``length (1 - ratio)`` is a whole number)."""
    if ratio is not None:
        return max(1, int(count * (1 - ratio)))
    return max(1, count * budget // length)


def protected_tokens(length: int, window: int, sink_tokens: int, device: torch.device | None = None) -> torch.Tensor:
    """``[S]`` bool: the protected tokens of a context of ``length``: the last ``window``, the first ``sink_tokens``."""
    positions = torch.arange(length, device=device)
    return (positions >= length - window) | (positions < sink_tokens)


def pad_protected(scores: torch.Tensor, window: int, sink_tokens: int) -> torch.Tensor:
    """``[H, S]`` scores with the protected tokens set to ``max + 1`` (kvpress's padding of a press's window: they
    rank first, yet a wrapper that rescales the scores sees a finite value)."""
    if not window and not sink_tokens:
        return scores
    return torch.where(protected_tokens(scores.shape[1], window, sink_tokens, scores.device), scores.max() + 1, scores)


def _topk_mask(scores: torch.Tensor, count: int) -> torch.Tensor:
    """``[H, S]`` bool: each head's top ``count`` (``torch.topk``'s choice among ties)."""
    indices = scores.topk(min(count, scores.shape[1]), dim=-1).indices
    return torch.zeros(scores.shape, dtype=torch.bool, device=scores.device).scatter(-1, indices, True)


def block_queries(observation: WindowObservation, candidates: torch.Tensor, window: int) -> torch.Tensor:
    """``[H_q, W, D]`` the queries kvpress's ``BlockPress`` gives a window press for ``candidates`` ``[H, n]`` (its
    cache order: the kept tokens, then the block): the layer's hidden states split in ``H_kv`` slices along the hidden
    dimension, slice ``h`` of row ``i`` taken from token ``candidates[h, i]`` (so a row mixes several tokens where the
    heads' candidates differ), the last ``W`` such rows through ``q_proj``, rotated at the prompt's last ``W``
    positions, in the model dtype.  Needs the hidden states (a model path: :mod:`kvbench.eviction.prerope`)."""
    prerope, count = observation.prerope, candidates.shape[1]
    project = getattr(prerope, "project_queries", None)
    hidden = getattr(prerope, "hidden_states", None)
    if project is None or hidden is None or observation.rotary is None:
        raise ValueError(
            "method.params.selection=chunk or block over a window scorer is kvpress's ChunkPress / BlockPress(press): "
            "each chunk or block is scored with its tokens' own queries, recomputed from the layer's hidden states; "
            "this path has none (a model whose attention module kvbench cannot project, or hand-built tensors)"
        )
    if count <= window:
        raise ValueError(
            f"method.params.selection=chunk / block: a chunk or block holds {count} tokens, not more than the window "
            f"{window}; kvpress's SnapKVPress asserts more (choose another selection_length or method.window)"
        )
    expand = int(getattr(prerope, "expand", 1))
    candidates = candidates[::expand, -window:]  # one row per KV head (query-head storage repeats them)
    length, width = hidden.shape
    slices = hidden.view(length, candidates.shape[0], width // candidates.shape[0])  # [S, H_kv, hidden / H_kv]
    rows = torch.stack([slices[candidates[h], h] for h in range(candidates.shape[0])], dim=1).reshape(window, width)
    queries = project(rows)  # [H_q, W, D]
    positions = torch.arange(observation.context_length - window, observation.context_length, device=queries.device)
    cos, sin = observation.rotary(positions, queries.dtype)
    return queries * cos + rotate_half(queries) * sin


def _candidates(observation: WindowObservation, positions: torch.Tensor) -> WindowObservation:
    """The observation restricted to ``positions`` ``[H, n]`` per head: their keys and values (and pre-RoPE keys),
    nothing else of the prompt's keys (column sums dropped; the window queries and prompt queries kept)."""
    index = positions[..., None].expand(-1, -1, observation.keys.shape[-1])
    return dataclasses.replace(
        observation,
        keys=observation.keys.gather(1, index),
        values=observation.values.gather(1, index),
        prompt_column_sums=None,
        _stats={},
        prerope=GatheredStates(prerope_states(observation), positions),
    )


def wrap_selection(method: EvictionMethod, selection: str, length: int = 0) -> EvictionMethod:
    """``method`` with its per-head top-k replaced by ``selection`` (``SELECTIONS``; ``topk`` returns it as it is),
    chunks or blocks of ``length`` tokens (0: kvpress's default)."""
    if selection == "topk":
        return method
    if selection not in SELECTIONS:
        raise ValueError(f"method.params.selection={selection!r} is not valid; valid: {', '.join(SELECTIONS)}")
    if method.scorer is None:
        raise ValueError(f"method.params.selection={selection!r} needs a scorer; method {method.name!r} has none")
    scorer = SelectionScorer(
        inner=method.scorer,
        selection=selection,
        length=length or DEFAULT_LENGTH[selection],
        gqa_agg=method.gqa_agg,
        window=method.window if method.keep_window else 0,
        sink_tokens=method.sink_tokens,
    )
    # The wrapper protects (module docstring): the session's own protection would add tokens to its counts.
    return dataclasses.replace(
        method, scorer=scorer, head_allocator=SelectedCountAllocator(), keep_window=False, sink_tokens=0
    )
