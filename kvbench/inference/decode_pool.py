"""A decode batch over one page pool per layer (issue #46): one attention call and one decode-policy step per layer
and step for all samples.

:class:`PooledBatch` holds the samples of a batched decode (each prefilled and compressed alone, exactly as at batch
1) in one :class:`~kvbench.cache.pool.PooledLayer` per model layer: sample ``b``'s stored heads are rows
``b * H .. (b + 1) * H - 1`` of every pool, each with its own block-table row and length.  A step runs the model once
on the ``[B, 1]`` batch with :class:`PooledCache` as ``past_key_values``: each layer appends every row's new token in
one write, attends in one call (:func:`kvbench.attention.pooled.pooled_attention`), and steps the method's decode
policy once over all rows with the samples' :class:`~kvbench.eviction.state.DecodeState` stacked into row tensors
(caps ``[R]``, running scores ``[R, C]``).  A sample leaving (:meth:`PooledBatch.leave`) gets its rows written back
into its own cache (as batch 1 would hold them) and its rows of the stacked state back into its session; its pages
return to the pool for the next sample (continuous batching).

Which batches pool (:func:`decode_path`; what generations chose is noted in :data:`DECODE_PATHS` for the run's
records): models without sliding windows, soft-capping or attention sinks, and methods with no decode policy or one
that steps sample rows (``steps_sample_rows``: StreamingLLM, H2O, TOVA, CAKE, AhaKV), and caches with every key
channel (ThinK's pruned layers are not pooled); the others decode with
:class:`~kvbench.cache.batched.BatchedCache`'s per-sample rows, as before.

Exactness: a sample's pooled rows keep its own slot order, lengths and positions; the policies compute the same
per-row values as at batch 1 (the row width is padded to the batch's longest, masked), but for the last bits of the
float32 query-key products they score with: the pool computes them page by page
(:meth:`~kvbench.cache.pool.PooledLayer.row_products`), and CPU BLAS sums a dot product in an order that depends on
the product's shape (so did the earlier padded product, whose width was the batch's longest row), about 1e-7
relative; only a tie between two tokens' scores that close could evict otherwise (the fidelity tests' tokens and
cache records are identical).  One corner is not exact: a step where some sample's head is more than one token over
its cap (a cap lowered below the stored length) takes every sample through the policy's general path (``keep``)
rather than only that sample.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache

from kvbench.attention.pooled import PooledKV
from kvbench.cache.kv_cache import HeadwiseLayer
from kvbench.cache.paged import DEFAULT_PAGE_SIZE, PagedLayer
from kvbench.cache.pool import PooledLayer
from kvbench.cache.quantized import QuantizedStorage
from kvbench.cache.quantized_pool import QuantizedPooledLayer
from kvbench.eviction.state import split_decode_state, stack_decode_states
from kvbench.inference.eviction import EvictionSession

#: The decode paths (:func:`decode_path`): the shared page pool, or each sample's own cache row by row.
POOLED, PER_SAMPLE = "pooled", "per_sample"


def decode_path(model: Any, session: EvictionSession) -> tuple[str, str | None]:
    """How ``session``'s samples decode in a batch on ``model``: ``("pooled", None)`` (a :class:`PooledBatch`), or
    ``("per_sample", why)`` (:class:`~kvbench.cache.batched.BatchedCache`'s rows; module docstring)."""
    config = model.config.get_text_config(decoder=True)
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return PER_SAMPLE, "sliding-window model (config.sliding_window)"
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return PER_SAMPLE, "attention logit soft-capping (config.attn_logit_softcapping)"
    if "gpt_oss" in str(config.model_type):
        return PER_SAMPLE, "attention sinks (gpt_oss)"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
        return PER_SAMPLE, "layers other than full attention (config.layer_types)"
    cache = session.cache
    if cache.sliding_layers or not all(isinstance(layer, HeadwiseLayer | PagedLayer) for layer in cache.layers):
        return PER_SAMPLE, "cache layers other than per-head torch or paged ones"
    if any(getattr(layer, "key_channels", None) is not None for layer in cache.layers):
        return PER_SAMPLE, "pruned key channels (ThinK)"
    policy = session.method.decode_policy
    if policy is None or session.budget.is_full or getattr(policy, "steps_sample_rows", False):
        return POOLED, None
    return PER_SAMPLE, f"decode policy {type(policy).__name__} does not step sample rows (steps_sample_rows)"


def pool_supported(model: Any, session: EvictionSession) -> bool:
    """Whether ``session``'s samples can decode in a :class:`PooledBatch` on ``model`` (:func:`decode_path`)."""
    return decode_path(model, session)[0] == POOLED


class DecodePathRecord:
    """Process-wide: the decode paths that batched generations took since the last :meth:`reset` (the runner
    records them per dataset in ``metrics.json`` and ``run_meta.json``)."""

    def __init__(self) -> None:
        self.paths: dict[tuple[str, str | None], int] = {}

    def note(self, path: str, reason: str | None) -> None:
        """One batched generation chose ``path`` (for ``reason``)."""
        self.paths[(path, reason)] = self.paths.get((path, reason), 0) + 1

    def reset(self) -> None:
        self.paths.clear()

    def taken(self) -> list[tuple[str, str | None]]:
        """The ``(path, reason)`` pairs noted, in the order first noted."""
        return list(self.paths)


DECODE_PATHS = DecodePathRecord()


class PooledCache(Cache):
    """The ``past_key_values`` of one pooled decoding step: layer ``l``'s update appends to pool ``l`` and returns
    :class:`~kvbench.attention.pooled.PooledKV` (keys and values both)."""

    def __init__(self, batch: PooledBatch) -> None:
        super().__init__(layers=list(batch.pools))
        self.batch = batch

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[PooledKV, PooledKV]:
        """Append ``[B, H_kv, 1, D]`` new keys and values, one token per sample, to the layer's pool."""
        pool = self.batch.pools[layer_idx]
        pool.append_rows(key_states, value_states)
        kv = PooledKV(pool, layer_idx, self.batch)
        return kv, kv


class PooledBatch:
    """The samples of a decode batch in one page pool per layer (module docstring).  Every sample's session shares
    the method and budget (one run)."""

    #: Pooled steps run in this process (what the GPU validation's batch phase reads to name the path it measured).
    steps_run = 0

    def __init__(self) -> None:
        self.sessions: list[EvictionSession] = []
        self.pools: list[PooledLayer] = []
        #: The samples' decode states stacked row by row (``None`` without a decode policy or sample).
        self.state: Any = None

    @property
    def size(self) -> int:
        return len(self.sessions)

    def join(self, session: EvictionSession) -> None:
        """Add a sample (its session in phase ``decode``): its cache's layers move into the pools, its decode state
        into the stacked state."""
        if self.sessions and (
            session.method is not self.sessions[0].method or session.budget != self.sessions[0].budget
        ):
            raise ValueError("a pooled decode batch runs one method and budget")
        layers = session.cache.headwise_layers
        if not self.pools:
            self.pools = [_new_pool(layer) for layer in layers]
        for pool, layer in zip(self.pools, layers, strict=True):
            pool.admit(layer)
        if self._steps_policy(session):
            assert session.decode_state is not None
            self.state = stack_decode_states(self.state, session.decode_state)
        self.sessions.append(session)

    def leave(self, session: EvictionSession) -> None:
        """Remove a sample: its rows go back into its own cache and session; its pages back to the pools."""
        index = self.sessions.index(session)
        for pool, layer in zip(self.pools, session.cache.headwise_layers, strict=True):
            heads = pool.heads_per_sample
            pool.release(index, layer)
        if self.state is not None and self._steps_policy(session):
            mine, self.state = split_decode_state(self.state, index * heads, heads)
            assert session.decode_state is not None
            session.decode_state.caps, session.decode_state.scores = mine.caps, mine.scores
            session.decode_state.scored = mine.scored
        del self.sessions[index]
        if not self.sessions:
            self.state = None

    def step(self, model: Any, next_ids: list[int], positions: list[int], device: torch.device) -> torch.Tensor:
        """One forward of every sample's next token (``next_ids[b]`` at ``positions[b]``, in join order); returns
        the ``[B, vocab]`` logits."""
        input_ids = torch.tensor([[token] for token in next_ids], dtype=torch.long, device=device)
        position_ids = torch.tensor([[position] for position in positions], dtype=torch.long, device=device)
        PooledBatch.steps_run += 1
        output = model(
            input_ids=input_ids,
            position_ids=position_ids,
            past_key_values=PooledCache(self),
            use_cache=True,
            logits_to_keep=1,
        )
        return output.logits[:, -1]

    def after_pooled_attention(self, layer_idx: int, layer: PooledLayer, query: torch.Tensor, scaling: float) -> None:
        """The decode policy's step over every sample's rows of the layer (the attention is done)."""
        session = self.sessions[0]
        if not self._steps_policy(session) or layer_idx not in session.compressible:
            return
        policy = session.method.decode_policy
        assert policy is not None
        policy.step(self.state, layer_idx, layer, query, scaling)

    @staticmethod
    def _steps_policy(session: EvictionSession) -> bool:
        return session.method.decode_policy is not None and not session.budget.is_full


def _new_pool(layer: Any) -> PooledLayer:
    """An empty pool for samples whose layer is like ``layer`` (heads, head dims, dtype, device, page size)."""
    keys, values = layer.head_kv(0)
    page_size = layer.page_size if isinstance(layer, PagedLayer) else DEFAULT_PAGE_SIZE
    pool = QuantizedPooledLayer if isinstance(layer, QuantizedStorage) else PooledLayer  # kv_quant: quantized rows
    return pool(
        layer.num_heads, keys.shape[-1], values.shape[-1], keys.dtype, keys.device, layer.expand_factor, page_size
    )
