"""The eviction session: applies an :class:`~kvbench.eviction.base.EvictionMethod` to a :class:`KVBenchCache`.

One session per sample.  The generation loop tells it the phase (compressing prefill, plain append, decode) and
passes it to the model's forward as ``kvbench_session``; kvbench's attention function calls
:meth:`EvictionSession.after_attention` once per layer with the layer's queries.

The compressed prefill may arrive in chunks (``run.prefill_chunk``): each chunk goes through the cache, and the
session keeps per layer what the method reads from the prompt rows -- the last ``W`` queries (the observation
window), the column sums of every row's attention when the scorer asks for them (H2O: accumulated chunk by chunk
against the keys stored so far, which are exactly the keys each row sees), every query when it asks for them --
and compresses the layer once its last chunk is stored, as after a one-shot prefill.

Selection rule (per layer, per stored head): tokens are ranked by the method's scores; *protected* tokens (the
observation window when ``keep_window``, the first ``sink_tokens`` positions) rank first, ties broken towards more
recent tokens; the head keeps the top ``k_h`` where ``k_h`` comes from the head allocator.  With
``window_in_budget=False`` the window is kept on top of the budget: the allocators see the total (or the fixed
per-layer budget) raised by one window per layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from kvbench import kernels
from kvbench.budget import Budget
from kvbench.cache.base import on_device
from kvbench.cache.kv_cache import HeadwiseLayer, KVBenchCache
from kvbench.checks import check_choice
from kvbench.eviction.base import AllocatorState, DecodeState, EvictionMethod, PromptRows, WindowObservation
from kvbench.eviction.threshold import new_decode_state, threshold_counts
from kvbench.eviction.token_scores import aggregate_groups
from kvbench.inference.cache_record import CacheRecord
from kvbench.inference.prompt_rows import PrefillRows, prompt_fingerprint, rank_tokens
from kvbench.inference.session_passes import SessionPasses

Phase = Literal["idle", "compress", "replay", "restore", "append", "decode"]


class EvictionSession(SessionPasses):
    """Drives one sample's eviction (see module docstring).

    Parameters
    ----------
    method:
        The method to apply.
    budget:
        The parsed budget.
    cache:
        The sample's cache (built with the method's GQA granularity).
    scoring_impl:
        Kernel implementation of the attention statistics (:attr:`WindowObservation.impl`): ``auto`` (default),
        ``triton``, ``torch``, or ``dense`` (the materialising reference, for comparisons).
    rotary:
        The model's rotary embedding tables (:attr:`WindowObservation.rotary`), or ``None``.
    dataset_state:
        What the method's layer allocator keeps across the samples of a dataset
        (:meth:`~kvbench.eviction.base.LayerBudgetAllocator.new_dataset_state`: XKV's sampled mode), created once
        per dataset by the runner; ``None``: the sample stands alone.

    The method is a frozen recipe shared by every sample; what this sample accumulates is the session's:
    :attr:`allocator_state` (the layer allocator's, from the first compressed layer on) and :attr:`decode_state`
    (the decode policy's caps and running scores).
    """

    def __init__(
        self,
        method: EvictionMethod,
        budget: Budget,
        cache: KVBenchCache,
        scoring_impl: str = "auto",
        rotary: Callable[[torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]] | None = None,
        dataset_state: Any = None,
    ) -> None:
        self.rotary = rotary
        self.scoring_impl = check_choice("scoring_impl", scoring_impl, kernels.SCORING_IMPLS)
        self.method = method
        self.budget = budget
        self.cache = cache
        self.num_layers = len(cache.layers)
        #: Model layer index -> its rank among the compressible layers (what allocators and scorers see).
        self.compressible = cache.compressible_layers
        self._rank = {layer_idx: rank for rank, layer_idx in enumerate(self.compressible)}
        self.phase: Phase = "idle"
        self.record = CacheRecord(compressible_layers=list(self.compressible), sliding_layers=cache.sliding_layers)
        self.context_length = 0
        self._scores: dict[int, list[torch.Tensor]] = {}
        self._requested: dict[int, tuple[int, list[int]]] = {}
        self._decode_caps: dict[int, list[int]] = {}
        #: The dtype the model computes in (its queries'), for head allocators that count in it.
        self._model_dtype = torch.float32
        self.dataset_state = dataset_state
        #: The layer allocator's state for this sample (``None`` until the first compressed layer needs it).
        self.allocator_state: AllocatorState | None = None
        #: The decode policy's state for this sample (``None`` without a policy; checks the budget's form).
        self.decode_state: DecodeState | None = new_decode_state(method, budget)
        if self.decode_state is not None:
            self.decode_state.rotary = rotary
        self._rows: dict[int, PrefillRows] = {}
        self.sample_key = 0
        #: Question tokens at the end of the compressed prompt (question-aware mode; set by the prefill): the
        #: observation window of a scorer whose window is the question (Finch).
        self.question_tokens = 0
        #: Per layer, ``[H, S]`` scores from the replay forwards (KVzip), in the model dtype.
        self._replay_scores: dict[int, torch.Tensor] = {}
        self._replay_attention: dict[int, torch.Tensor] = {}  # KVgrad: [H, G, q, c] per layer, until the backward
        self._replay_span = (0, 0)
        self._replay_prefix: int | None = None
        self.replayed = False
        #: Tokens a restore pass appended after the prompt and the eviction keeps (RestoreKV's ``n``).
        self.restored_tokens = 0
        #: Where the tokens after the compressed prompt are fed: ``None`` = after its last position; a number when
        #: the kept keys were re-rotated to contiguous positions (Finch).
        self.next_position: int | None = None
        #: Per re-rotated layer, the prompt positions ``[H, n]`` its kept keys came from.
        self.rerotated_from: dict[int, torch.Tensor] = {}
        #: Forward pre-hooks that hand the layers' hidden states over during the compressing prefill
        #: (:func:`kvbench.inference.hidden_states.capture_hidden_states`); removed when the prefill ends (the
        #: decode policy's, ``decode_hooks``, at :meth:`finish`).
        self.hooks: list[Any] = []
        self.decode_hooks: list[Any] = []

    # ------------------------------------------------------------------ phases
    @property
    def compresses(self) -> bool:
        """Whether prefill compression applies (a scorer and a non-full budget)."""
        return self.method.scorer is not None and not self.budget.is_full

    @property
    def replays(self) -> bool:
        """Whether the scorer scores the prompt by forwards of its own after the prefill (KVzip's context
        reconstruction, :mod:`kvbench.inference.replay`) and compresses every layer at once after them."""
        return self.compresses and bool(getattr(self.method.scorer, "replays_context", False))

    @property
    def eager_attention(self) -> bool:
        """Whether the forward in progress attends as transformers' ``eager_attention_forward`` (logits in the model
        dtype, a float32 softmax cast back, then the values; kvbench's attention function reads it) instead of SDPA:
        the scorer's ``eager_attention`` (KVCompose: kvpress's press forces eager attention for its forwards) while
        the compressed prompt is prefilled and replayed, never once tokens are appended or decoded."""
        eager = bool(getattr(self.method.scorer, "eager_attention", False))
        return eager and self.compresses and self.phase in ("compress", "replay")

    def observation_window(self) -> int:
        """Window queries the scorer sees: ``params.window``, or the question's tokens for a scorer whose window is
        the question (Finch's ``question_window``; ``params.window`` when the compressed prompt has no question)."""
        if getattr(self.method.scorer, "question_window", False) and self.question_tokens > 0:
            return self.question_tokens
        return self.method.window

    @property
    def position_shift(self) -> int:
        """How many positions earlier than the count of tokens fed the next token goes (re-rotated keys: Finch)."""
        return 0 if self.next_position is None else self.context_length - self.next_position

    def begin_prefill(self, context_length: int, prompt_ids: Sequence[int] | None = None) -> None:
        """The next forwards are the (compressed) context prefill of ``context_length`` tokens, in one forward or
        in chunks; each layer is compressed once all ``context_length`` tokens are stored.

        ``prompt_ids`` (the compressed tokens) give the sample its :attr:`WindowObservation.sample_key`.
        """
        self.phase = "compress"
        self.sample_key = prompt_fingerprint(prompt_ids) if prompt_ids is not None else 0
        self.context_length = context_length
        self.record.context_tokens = context_length

    def begin_append(self) -> None:
        """The next forward appends tokens (a question) without compressing."""
        self._finish_prefill()
        self.phase = "append"

    def begin_decode(self) -> None:
        """Following forwards are decoding steps."""
        self._finish_prefill()
        self.phase = "decode"

    def finish(self) -> CacheRecord:
        """End of the sample: fill the final sizes and return the record."""
        for handle in self.decode_hooks:
            handle.remove()
        self._finish_prefill()
        self.record.final_per_layer = self.cache.layer_lengths()
        self._note_bytes(prefill=False)
        if self.cache.stored_bytes() > self.cache.full_cache_bytes():
            self.record.exceeds_full_cache = True
        if self.allocator_state is not None:
            self.record.allocator_state = self.method.layer_allocator.sample_state(self.allocator_state)
        return self.record

    # ------------------------------------------------------------------ attention callback
    def kept_scores(self, layer_idx: int) -> list[torch.Tensor] | None:
        """The scorer's scores of each head's kept tokens after the layer's prefill compression, ``[n_h]`` per head
        in position order (what the decode policy starts from); ``None`` for a layer that was not scored."""
        scores = self._scores.get(layer_idx)
        return None if scores is None else list(scores)

    def take_hidden_states(self, module: torch.nn.Module, hidden_states: torch.Tensor) -> None:
        """Called before a compressible layer's attention with its input ``hidden_states`` ``[1, q, hidden]``
        (pre-RoPE states; kept until the layer is compressed)."""
        layer_idx = int(module.layer_idx)
        if self.phase != "compress" or layer_idx not in self._rank or not self.compresses:
            return
        rows = self._rows.setdefault(layer_idx, PrefillRows())
        rows.hidden_states.append(hidden_states[0].detach())
        rows.attention_module = module

    def release_hooks(self) -> None:
        """Remove the hidden-states hooks (the prefill is over, or was abandoned)."""
        for handle in self.hooks:
            handle.remove()
        self.hooks = []

    def after_attention(self, module: torch.nn.Module, query: torch.Tensor, scaling: float) -> None:
        """Called by kvbench's attention for every layer with ``query`` ``[1, H_q, q, D]``."""
        layer_idx = int(module.layer_idx)
        if layer_idx not in self._rank:  # a sliding-window layer: never evicted
            if self.phase == "compress":
                self._note_bytes(prefill=True)
            return
        layer = self.cache.headwise_layers[layer_idx]
        policy = self.method.decode_policy
        if self.phase == "replay":
            self._replay_layer(layer_idx, layer, query[0])
        elif self.phase == "compress":
            self._output_projection = getattr(getattr(module, "o_proj", None), "weight", None)  # CriticalKV's
            self._prefill_chunk(layer_idx, layer, query[0], scaling)
        elif policy is None or self.budget.is_full:
            return
        elif self.phase == "decode":
            assert self.decode_state is not None
            policy.step(self.decode_state, layer_idx, layer, query[0], scaling)
        elif self.phase == "append":
            self._note_bytes(prefill=False)  # the question is stored, not yet evicted
            # A multi-token forward after the prefill: each policy does what its reference does with one
            # (TOVA scores the last query; H2O adds every new row's attention; both then evict to the caps).
            assert self.decode_state is not None
            policy.append(self.decode_state, layer_idx, layer, query[0], scaling)

    # ------------------------------------------------------------------ prefill compression
    def _prefill_chunk(self, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float) -> None:
        """One prefill forward at a layer: keep the rows the method needs; compress after the last chunk."""
        context = layer.seen_tokens
        self._note_bytes(prefill=True)
        if not self.compresses:
            self._requested[layer_idx] = (context, [context] * layer.num_heads)
            return
        assert self.method.scorer is not None
        if self.replays:  # scored by the replay forwards (or the hidden states) after the prefill, then compressed
            return self._score_hidden_states(layer_idx, context)
        rows = self._rows.setdefault(layer_idx, PrefillRows())
        needs = self.method.scorer.prompt_rows(query.dtype)
        pruner, policy = self.method.key_channel_pruner, self.method.decode_policy
        pruner_window = 0 if pruner is None else pruner.window
        window = max(self.observation_window(), pruner_window, policy.prompt_window if policy else 0)
        rows.add(layer, query, scaling, window, needs, self.scoring_impl, self.context_length)
        if context < self.context_length:
            return  # more chunks to come
        del self._rows[layer_idx]
        self._compress_prefill(layer_idx, layer, rows, scaling)

    def _compress_prefill(self, layer_idx: int, layer: HeadwiseLayer, rows: PrefillRows, scaling: float) -> None:
        context = layer.seen_tokens
        num_heads = layer.num_heads
        keys, values = layer.dense_kv()
        assert rows.window_queries is not None
        window = min(self.observation_window(), context)
        queries = rows.window_queries[:, -window:]
        # Allocators and scorers see the compressible layers only, numbered 0..L_c-1 (sliding layers skipped).
        rank, num_compressible = self._rank[layer_idx], len(self.compressible)
        self._model_dtype = queries.dtype
        needs = self.method.scorer.prompt_rows(queries.dtype) if self.method.scorer is not None else PromptRows()
        prerope = rows.prerope(self.cache.expand_factor) if needs.keeps_hidden_states else None
        if needs.prerope:
            source = "unrotated" if prerope is None else prerope.source
            previous = self.record.prerope_states
            self.record.prerope_states = source if previous in (None, source) else "mixed"
        observation = WindowObservation(
            layer_idx=rank,
            num_layers=num_compressible,
            queries=queries,
            keys=keys,
            values=values,
            scaling=scaling,
            prompt_queries=rows.prompt_queries(),
            prompt_column_sums=rows.column_sums,
            impl=self.scoring_impl,
            sample_key=self.sample_key,
            rotary=self.rotary,
            output_projection=getattr(self, "_output_projection", None),
            prerope=prerope,
        )
        # With window_in_budget=False every layer keeps its window on top of the budget: allocators see it added.
        off_budget = 0 if self.method.window_in_budget else window
        if self.budget.fixed_per_layer or self.budget.is_threshold:  # a threshold: what scores above it stays
            budgets = {rank: context if self.budget.is_threshold else int(self.budget.value) + off_budget}
        else:
            allocator = self.method.layer_allocator
            if self.allocator_state is None:
                self.allocator_state = allocator.start_sample(
                    self.budget, num_compressible, context, self.dataset_state, extra_per_layer=off_budget
                )
            budgets = allocator.on_layer(self.allocator_state, observation)
        if rank in budgets:
            observation.layer_budget = int(budgets[rank])
            observation.compression_ratio = self.budget.kvpress_ratio(context, observation.layer_budget)
        assert self.method.scorer is not None
        raw = self.method.scorer.score(observation)
        if needs.hidden_states and prerope is not None and hasattr(self.method.scorer, "learned_weights"):
            self.record.learned_weights = self.method.scorer.learned_weights(prerope.module)  # KVzap's checkpoint
        # [H_stored, S]: one row per stored head; [H_q, S] (per query head) is reduced by method.gqa_agg.
        if tuple(raw.shape) not in ((num_heads, context), (queries.shape[0], context)):
            raise ValueError(
                f"scorer {type(self.method.scorer).__name__} returned scores of shape {tuple(raw.shape)} at layer "
                f"{layer_idx}; a scorer returns [H_stored, S] = ({num_heads}, {context}), one row per stored head "
                f"(or [H_q, S] = ({queries.shape[0]}, {context}), reduced per GQA group by method.params.gqa_agg)"
            )
        scores = aggregate_groups(raw.float(), num_heads, self.method.gqa_agg)
        self._scores[layer_idx], self._score_dtype = list(scores.unbind(0)), raw.dtype  # threshold: compared in it
        for target_rank, layer_budget in sorted(budgets.items()):
            self._shrink_layer(self.compressible[target_rank], int(layer_budget), window)
        if getattr(self.method.scorer, "rerotates_keys", False):
            self._rerotate(layer_idx, layer)
        pruner = self.method.key_channel_pruner
        if pruner is not None:  # ThinK: after the tokens, the key channels (kvpress's ComposedPress order)
            head_keys = [layer.head_kv(head)[0] for head in range(num_heads)]
            channels = pruner.kept_channels(rows.window_queries[:, -pruner.window :], head_keys)
            if channels is not None:
                layer.prune_key_channels(channels, prune_appended=pruner.prune_appended)
        policy = self.method.decode_policy
        if policy is not None and policy.prompt_window and self.decode_state is not None:
            policy.take_prompt_queries(self.decode_state, layer_idx, rows.window_queries[:, -policy.prompt_window :])
        if policy is not None and self.decode_state is not None:
            policy.take_prefill_scores(self.decode_state, layer_idx, scores)

    def _shrink_layer(self, layer_idx: int, keep_total: int, window: int) -> None:
        """Evict ``layer_idx`` down to ``keep_total`` tokens per head (window and sinks included)."""
        layer = self.cache.headwise_layers[layer_idx]
        method = self.method
        lengths = layer.head_lengths()
        scores = self._scores[layer_idx]
        protected = []
        for head in range(layer.num_heads):
            positions = layer.positions[head]
            recent = positions >= self.context_length - getattr(method.scorer, "protect_last", 0)  # DMS's window
            mask = (positions < method.sink_tokens) | recent
            if method.keep_window:
                mask = mask | (positions >= self.context_length - window)
            protected.append(mask)
        padded = _pad_scores(scores, protected)
        if self.budget.is_threshold:
            counts = threshold_counts(padded, self.budget.value, self._score_dtype)
        else:
            counts = method.head_allocator.allocate_for(padded, keep_total, self._model_dtype)
        counts = [min(int(count), length) for count, length in zip(counts, lengths, strict=True)]
        requested = round(sum(counts) / len(counts)) if self.budget.is_threshold else keep_total  # a threshold's
        self._requested[layer_idx] = (requested, counts)
        # While decoding, a head that was cut keeps its allocation; one that was not grows to the layer budget before
        # evicting -- unless the allocator sets its own decode budget (CAKE's, when its prefill trigger did not fire).
        decode_budget = (
            None
            if self.allocator_state is None
            else method.layer_allocator.decode_budget(self.allocator_state, self._rank[layer_idx])
        )
        self._decode_caps[layer_idx] = [
            decode_budget if decode_budget is not None else count if count < length else max(keep_total, length)
            for count, length in zip(counts, lengths, strict=True)
        ]
        if all(count >= length for count, length in zip(counts, lengths, strict=True)):
            return
        keep: list[torch.Tensor] = []
        for head in range(layer.num_heads):
            order = rank_tokens(scores[head], layer.positions[head], protected[head])
            keep.append(order[: counts[head]])
        kept_sorted = [torch.sort(idx).values for idx in keep]
        merged = None if method.value_merger is None else method.value_merger.merged_values(layer, kept_sorted, padded)
        with on_device(layer.positions[0].device):  # an allocator may shrink a layer on another GPU
            layer.keep(kept_sorted)
            if merged is not None:
                layer.rewrite_values(merged)
        self._scores[layer_idx] = [s.index_select(0, idx) for s, idx in zip(scores, kept_sorted, strict=True)]
        self.record.evicted = True

    def _finish_prefill(self) -> None:
        """Close the prefill record once (requested/achieved per layer and head, bytes)."""
        self.release_hooks()
        if self.phase != "compress":
            return
        self.phase = "idle"
        record = self.record
        for layer_idx, layer in enumerate(self.cache.headwise_layers):
            seen = layer.seen_tokens if layer_idx in self._rank else max(layer.head_lengths(), default=0)
            requested_total, requested_heads = self._requested.get(layer_idx, (seen, [seen] * layer.num_heads))
            record.requested_per_layer.append(min(requested_total, layer.seen_tokens))
            record.requested_per_head.append(requested_heads)
            record.achieved_per_head.append(layer.head_lengths())
            caps = self._decode_caps.get(layer_idx, requested_heads)
            record.decode_cap_per_layer.append(round(sum(caps) / len(caps)) if caps else 0)
            if self.method.decode_policy is not None and not self.budget.is_full and layer_idx in self._rank:
                assert self.decode_state is not None
                scores = self._scores.get(layer_idx)
                self.method.decode_policy.start_layer(self.decode_state, layer_idx, layer, caps, scores)
        record.achieved_per_layer = self.cache.layer_lengths()
        record.stored_bytes = self.cache.stored_bytes()
        record.allocated_bytes = self.cache.allocated_bytes()
        self._note_bytes(prefill=False)
        record.full_cache_bytes = self.cache.full_cache_bytes()
        layers = [self.cache.headwise_layers[idx] for idx in self.compressible]
        record.stored_heads = layers[0].num_heads if layers else 0
        record.kv_heads = record.stored_heads // self.cache.expand_factor
        record.exceeds_full_cache = record.stored_bytes > record.full_cache_bytes

    def _note_bytes(self, prefill: bool) -> None:
        """Raise the record's peaks to the cache's current stored / allocated bytes (``prefill``: the prefill peak
        too).  Measured at every layer of the prefill, of a question appended after it, and at the end of the sample:
        a decoding step appends one token per head and evicts at most one, so stored bytes only grow while decoding
        (a step's one token per head before its eviction is not counted)."""
        stored, allocated = self.cache.stored_bytes(), self.cache.allocated_bytes()
        record = self.record
        if prefill:
            record.peak_prefill_bytes = max(record.peak_prefill_bytes, stored)
        record.peak_stored_bytes = max(record.peak_stored_bytes, stored)
        record.peak_allocated_bytes = max(record.peak_allocated_bytes, allocated)


def _pad_scores(scores: list[torch.Tensor], protected: list[torch.Tensor]) -> torch.Tensor:
    """Stack per-head scores into ``[H, S_max]``: protected tokens +inf, padding -inf."""
    width = max(int(s.shape[0]) for s in scores)
    padded = torch.full((len(scores), width), float("-inf"), dtype=torch.float32, device=scores[0].device)
    for head, (score, mask) in enumerate(zip(scores, protected, strict=True)):
        padded[head, : score.shape[0]] = torch.where(mask, torch.inf, score.float())
    return padded
