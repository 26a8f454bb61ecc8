"""What a scorer sees of one layer at compression time (moved out of :mod:`kvbench.eviction.base`, which re-exports
both names).

* :class:`WindowObservation` -- the observation window's queries, the layer's keys and values, and what the session
  adds (prompt rows' column sums, pre-RoPE states, the rotary tables).
* :class:`PromptRows` -- what an indicator asks the session to keep from the prompt rows before the window.

Shapes use ``H_q`` query heads, ``H`` stored heads, ``W`` window queries, ``S`` context tokens, ``D`` head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from kvbench import kernels
from kvbench.eviction.prerope import PreRopeStates

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    pass


@dataclass
class WindowObservation:
    """Everything a scorer or allocator may look at for one layer at the end of a compressed prefill.

    The attention statistics come from the fused kernels (:mod:`kvbench.kernels`): :meth:`window_stats` and
    :meth:`column_sums` never build the ``[H_q, W, S]`` or ``[H_q, S, S]`` matrix (the dense reference is
    ``kvbench.kernels.reference``, used by the tests and by ``impl="dense"``).

    Attributes
    ----------
    layer_idx, num_layers:
        Which layer, out of how many.
    queries:
        ``[H_q, W, D]`` post-RoPE queries of the last ``W`` prompt tokens (the observation window).
    keys, values:
        ``[H, S, D]`` the layer's stored keys (post-RoPE) and values; the window's own keys are ``keys[:, S-W:]``.
    scaling:
        Softmax scale of the model's attention (usually ``D ** -0.5``).
    prompt_queries:
        ``[H_q, R, D]`` post-RoPE queries of the last ``R`` prompt tokens: every one (``R = S``) unless the scorer
        asked for fewer (``None`` unless it asked for them with :meth:`TokenScorer.prompt_rows`).
    prompt_column_sums:
        ``[H_q, S]`` float32 attention each key received from every prompt row (accumulated by the session over
        the prefill chunks when the scorer asked for it), or ``None`` (then :meth:`column_sums` computes it from
        ``prompt_queries``).
    layer_budget:
        The budget (tokens per head) the allocator has just set for this layer, when known before scoring
        (AhaKV's step-gain softmax derives its temperature from it); ``None`` otherwise.
    impl:
        Kernel implementation of the statistics: ``auto`` (Triton on CUDA, chunked torch on CPU), ``triton``,
        ``torch``, or ``dense`` (the materialising reference; for comparisons).
    sample_key:
        A stable number identifying the sample: a hash of the compressed prompt's token ids (0 when unknown).
        Methods that draw random numbers (NACL) seed from it, so a sample's draws do not depend on which samples
        ran before it (resumed runs, subsets, reordering).
    rotary:
        The model's rotary position embedding, when it has one: ``rotary(positions [N], dtype) -> (cos, sin)``, each
        ``[N, D]`` in ``dtype``, as the model's own rotary module computes them (scorers that need pre-RoPE states
        or future positions' rotations: Expected Attention); ``None`` when unknown.
    output_projection:
        ``[hidden, H_q D]`` the layer's attention output projection weight (``o_proj.weight``), when the model has
        one (CriticalKV's value norms); ``None`` when unknown.
    compression_ratio:
        kvpress's ``compression_ratio`` c when the budget is ``<c>cr`` and this layer keeps its uniform share
        ``max(1, int(S (1 - c)))`` (the session sets it with :attr:`layer_budget`); ``None`` otherwise.  The
        kvpress-referenced scorers and wrappers that compute a count from c itself (ChunkKV's chunks, ChunkPress's
        per-chunk counts, CriticalKV's first stage, Compactor's blending, StreamingLLM's pruned count) take kvpress's
        arithmetic from it; under any other budget they derive the count from :attr:`layer_budget`.
    prerope:
        The layer's pre-RoPE keys and queries recomputed from its input hidden states (kvpress's way), when the
        scorer asked for them (:attr:`PromptRows.prerope_keys`) and the session could keep those; ``None``
        otherwise (then :func:`kvbench.eviction.prerope.prerope_states` un-rotates the stored states).
    """

    layer_idx: int
    num_layers: int
    queries: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    scaling: float
    prompt_queries: torch.Tensor | None = None
    prompt_column_sums: torch.Tensor | None = None
    layer_budget: int | None = None
    impl: str = "auto"
    _stats: dict[Any, kernels.WindowStats] = field(default_factory=dict, repr=False, compare=False)
    sample_key: int = 0
    rotary: Callable[[torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]] | None = None
    output_projection: torch.Tensor | None = None
    prerope: PreRopeStates | None = None
    #: Per stored head, the budgets the layer allocator set for this layer when it sets them per head (LU-KV's
    #: curve, :mod:`kvbench.methods.lukv`); ``None`` otherwise.
    head_budgets: list[int] | None = None
    compression_ratio: float | None = None

    @property
    def window(self) -> int:
        return int(self.queries.shape[1])

    @property
    def context_length(self) -> int:
        return int(self.keys.shape[1])

    @property
    def num_heads(self) -> int:
        """Stored heads ``H``."""
        return int(self.keys.shape[0])

    @property
    def model_dtype(self) -> torch.dtype:
        """The dtype the model computes in (the references cast their float32 softmax back to it)."""
        return self.queries.dtype

    def window_stats(self, prob_dtype: torch.dtype | None = None) -> kernels.WindowStats:
        """Statistics of the window's float32 softmax attention over all keys (causal in the window); computed once
        per ``prob_dtype`` (scorer and allocator share them).  See :class:`kvbench.kernels.WindowStats`.

        ``prob_dtype`` (the model dtype under ``score_dtype=model``) rounds as the reference code does: the logits
        of its ``matmul(q, k^T) / sqrt(d)`` in that dtype, then each probability of its float32 softmax cast back.
        """
        if prob_dtype not in self._stats:
            self._stats[prob_dtype] = kernels.window_stats(
                self.queries, self.keys, self.scaling, prob_dtype=prob_dtype, logit_dtype=prob_dtype, impl=self.impl
            )
        return self._stats[prob_dtype]

    def use_window_stats(self, stats: kernels.WindowStats, prob_dtype: torch.dtype | None = None) -> None:
        """Give the observation the window statistics :meth:`window_stats` returns for ``prob_dtype``, instead of
        computing them from ``queries`` and ``keys`` (statistics of a given attention, e.g. a hand-made ``[H_q, W,
        S]`` probability tensor through :func:`kvbench.kernels.reference.stats_of_probs`)."""
        self._stats[prob_dtype] = stats

    def last_query_attention(self, prob_dtype: torch.dtype | None = None) -> torch.Tensor:
        """``[H_q, S]`` float32 attention of the last prompt query over all keys (TOVA's prefill score), logits and
        probabilities rounded to ``prob_dtype`` when given (as :meth:`window_stats`)."""
        last = self.queries[:, -1:]
        return kernels.window_stats(
            last, self.keys, self.scaling, prob_dtype=prob_dtype, logit_dtype=prob_dtype, impl=self.impl
        ).col_sum

    def column_sums(self, prob_dtype: torch.dtype | None = None) -> torch.Tensor:
        """``[H_q, S]`` float32 attention each key receives from every prompt row (H2O's all-rows score), logits
        and probabilities rounded to ``prob_dtype`` first when given (as :meth:`window_stats`).

        The session's accumulated sums when it has them (it rounds as :meth:`TokenScorer.prompt_rows` asked),
        else computed from ``prompt_queries``.
        """
        if self.prompt_column_sums is not None:
            return self.prompt_column_sums
        queries = self.prompt_queries
        if queries is None or queries.shape[1] != self.context_length:
            raise ValueError(
                "all-rows scores need the column sums or the queries of every prompt row; the scorer must ask for "
                "them with TokenScorer.prompt_rows"
            )
        return kernels.causal_column_sums(
            queries, self.keys, self.scaling, prob_dtype=prob_dtype, logit_dtype=prob_dtype, impl=self.impl
        )


@dataclass(frozen=True)
class PromptRows:
    """What an indicator reads from the prompt rows *before* the observation window.

    The session keeps it across the chunks of a chunked prefill (``run.prefill_chunk``), so the indicator sees what
    a one-shot prefill gives it.

    Attributes
    ----------
    column_sums:
        The attention each key receives from every prompt row (:attr:`WindowObservation.prompt_column_sums`),
        accumulated chunk by chunk: ``O(H_q x S)`` floats per layer.
    prob_dtype:
        Rounding of the logits and of each probability in those sums (``None`` = float32).
    queries:
        The prompt queries (:attr:`WindowObservation.prompt_queries`), kept across chunks: every one, ``O(H_q x S x
        D)`` per layer (AhaKV's ``ra: false`` ablation, whose per-row temperature needs the layer budget), or only
        the last ``query_rows(S)`` of a prompt of ``S`` tokens (NACL's proxy rows).
    query_rows:
        ``S -> R``: how many of the last prompt queries to keep (``None`` = all ``S``).
    prerope_keys, prerope_queries:
        The pre-RoPE keys / queries of every prompt row (:attr:`WindowObservation.prerope`,
        :mod:`kvbench.eviction.prerope`).  On a model path the session keeps the layer's input hidden states (``O(S
        x hidden)`` per layer across the chunks of a chunked prefill; nothing extra in one forward) and they are
        recomputed from them; without hidden states they are un-rotated from the stored keys and, for queries, from
        every prompt query, which the session then keeps as if ``queries`` were asked.
    hidden_states:
        The layer's input hidden states themselves (a learned scorer's input: KVzap), in
        :attr:`WindowObservation.prerope` (``hidden_states`` and ``module`` of its
        :class:`~kvbench.inference.hidden_states.ProjectedStates`); kept as for the pre-RoPE states.
    """

    column_sums: bool = False
    prob_dtype: torch.dtype | None = None
    queries: bool = False
    query_rows: Callable[[int], int] | None = None
    prerope_keys: bool = False
    prerope_queries: bool = False
    hidden_states: bool = False

    @property
    def prerope(self) -> bool:
        """Whether the scorer reads pre-RoPE states."""
        return self.prerope_keys or self.prerope_queries

    @property
    def keeps_hidden_states(self) -> bool:
        """Whether the session keeps the layer's input hidden states (pre-RoPE states or the states themselves)."""
        return self.prerope or self.hidden_states
