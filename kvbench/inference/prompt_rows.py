"""What an eviction session keeps of a compressed prompt's rows across its chunks (:class:`PrefillRows`), and the
two rules every session applies: a prompt's fingerprint (:func:`prompt_fingerprint`, the sample key of seeded
allocators) and the order of a head's tokens by score (:func:`rank_tokens`).  Used by
:class:`kvbench.inference.eviction.EvictionSession`."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kvbench import kernels
from kvbench.cache.kv_cache import HeadwiseLayer
from kvbench.eviction.base import PromptRows
from kvbench.inference.hidden_states import ProjectedStates


def prompt_fingerprint(token_ids: Sequence[int]) -> int:
    """A stable 63-bit hash of a prompt's token ids (the :attr:`WindowObservation.sample_key` of its sample)."""
    digest = hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def rank_tokens(scores: torch.Tensor, positions: torch.Tensor, protected: torch.Tensor) -> torch.Tensor:
    """Order of one head's stored slots from most to least worth keeping.

    Parameters
    ----------
    scores:
        ``[S]`` importance (higher = keep); ``-inf`` never wins over a finite score.
    positions:
        ``[S]`` true token positions (ties are broken towards larger positions, i.e. more recent tokens).
    protected:
        ``[S]`` bool, tokens that rank before every unprotected one.

    Returns
    -------
    ``[S]`` slot indices.
    """
    by_recency = torch.argsort(positions, descending=True, stable=True)
    ranked_scores = torch.where(protected[by_recency], torch.inf, scores[by_recency].float())
    by_score = torch.argsort(ranked_scores, descending=True, stable=True)
    return by_recency[by_score]


@dataclass
class PrefillRows:
    """One layer's prompt rows kept across the chunks of a compressed prefill (module docstring).

    Attributes
    ----------
    window_queries:
        ``[H_q, <=W, D]`` the last ``W`` queries seen so far.
    column_sums:
        ``[H_q, S_seen]`` float32 attention each stored key received from every row so far (when asked for).
    queries:
        The query chunks so far (when asked for), trimmed to the last ``needs.query_rows(S)`` rows when given.
    hidden_states, attention_module:
        The layer's input hidden states, ``[q, hidden]`` per chunk so far, and its attention module (pre-RoPE
        states, :mod:`kvbench.inference.hidden_states`), when the session captures them.
    """

    window_queries: torch.Tensor | None = None
    column_sums: torch.Tensor | None = None
    queries: list[torch.Tensor] = field(default_factory=list)
    hidden_states: list[torch.Tensor] = field(default_factory=list)
    attention_module: torch.nn.Module | None = None

    def add(self, layer: HeadwiseLayer, query: torch.Tensor, scaling: float, window: int, needs: PromptRows,
            impl: str, prompt_length: int) -> None:  # fmt: skip
        """Take one chunk: ``query`` ``[H_q, q, D]``, the last ``q`` tokens stored in ``layer`` (of a compressed
        prompt of ``prompt_length`` tokens)."""
        recent = query if self.window_queries is None else torch.cat([self.window_queries, query], dim=1)
        self.window_queries = recent[:, -window:].clone()  # not a view: the chunk's queries are freed
        if needs.column_sums:
            keys, _ = layer.dense_kv()  # every key stored so far: exactly the keys these rows see
            sums = kernels.causal_column_sums(
                query, keys, scaling, prob_dtype=needs.prob_dtype, logit_dtype=needs.prob_dtype, impl=impl
            )
            if self.column_sums is not None:
                sums[:, : self.column_sums.shape[1]] += self.column_sums
            self.column_sums = sums
        if needs.queries or (needs.prerope_queries and not self.hidden_states):  # un-rotated without hidden states
            self.queries.append(query)
            if needs.query_rows is not None:  # only the last rows: one trimmed copy, the chunks are freed
                kept = self.prompt_queries()
                assert kept is not None
                self.queries = [kept[:, -needs.query_rows(prompt_length) :].clone()]

    def prompt_queries(self) -> torch.Tensor | None:
        """``[H_q, R, D]`` the kept queries, the last ``R`` of the prompt (``None`` unless kept)."""
        if not self.queries:
            return None
        return self.queries[0] if len(self.queries) == 1 else torch.cat(self.queries, dim=1)

    def prerope(self, expand: int) -> ProjectedStates | None:
        """The layer's pre-RoPE states from its hidden states (``None`` when none were captured)."""
        if not self.hidden_states or self.attention_module is None:
            return None
        hidden = self.hidden_states[0] if len(self.hidden_states) == 1 else torch.cat(self.hidden_states)
        return ProjectedStates(self.attention_module, hidden, expand)
