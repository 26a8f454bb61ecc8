"""What one sample's cache held: requested versus achieved sizes, and bytes (written to each prediction row)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CacheRecord:
    """Requested versus achieved cache sizes of one sample (tokens per stored head)."""

    context_tokens: int = 0
    requested_per_layer: list[int] = field(default_factory=list)
    requested_per_head: list[list[int]] = field(default_factory=list)
    achieved_per_layer: list[int] = field(default_factory=list)
    achieved_per_head: list[list[int]] = field(default_factory=list)
    evicted: bool = False
    #: Key + value bytes of the kept tokens once the prefill is compressed (what the method costs; the same on every
    #: backend), and what the backend holds for them then (spare capacity / free pages included).
    stored_bytes: int = 0
    allocated_bytes: int = 0
    #: Largest stored bytes at any point of the compressed prefill (measured when each layer's attention is done,
    #: before its eviction: earlier layers compressed so far + this layer's full cache; with a chunked prefill every
    #: layer holds its full cache until its last chunk).
    peak_prefill_bytes: int = 0
    #: Largest stored / allocated bytes over the whole sample (prefill, question, decoding).
    peak_stored_bytes: int = 0
    peak_allocated_bytes: int = 0
    final_per_layer: list[int] = field(default_factory=list)
    #: Tokens per forward of the compressed prefill (0: one forward; ``run.prefill_chunk``).
    prefill_chunk: int = 0
    #: Per layer, the cache size (tokens per stored head, mean over heads) decode-time eviction keeps: the budget,
    #: also when the prompt was shorter (the cache grows to it first, as the references).
    decode_cap_per_layer: list[int] = field(default_factory=list)
    #: Heads stored per layer (KV heads, or query heads with ``gqa_granularity=query_head``) and the model's KV heads.
    stored_heads: int = 0
    kv_heads: int = 0
    #: Bytes the full cache (KV heads, nothing evicted) holds for the same tokens, when ``stored_bytes`` was measured,
    #: and whether the stored cache exceeded it then or at the end (query-head storage at a generous budget).
    full_cache_bytes: int = 0
    exceeds_full_cache: bool = False
    #: What a stateful layer allocator records about this sample (XKV's sampled mode: its calibration shares), so a
    #: resumed run can replay it; ``None`` for the others.
    allocator_state: dict[str, Any] | None = None
    #: The model layers eviction acts on (full attention): budgets are stated per compressible layer and the layer
    #: allocators distribute over these only.
    compressible_layers: list[int] = field(default_factory=list)
    #: The sliding-window layers (:mod:`kvbench.cache.sliding`): never evicted, each holds at most its window.
    sliding_layers: list[int] = field(default_factory=list)
    #: Forwards a method ran on top of the prompt (KVzip's context reconstruction, RestoreKV's restore pass); their
    #: seconds are part of the sample's prefill seconds (the run's timing log, ``prefill_s_mean``).
    extra_forwards: int = 0
    #: ``original`` (kept keys at their prompt positions) or ``rerotated`` (Finch: re-rotated to contiguous positions
    #: ``0 .. n-1``, and the tokens after the prompt continue from ``next_position``).
    key_positions: str = "original"
    #: Where the tokens after the prompt are fed, when not right after it: Finch's ``n``, RestoreKV's ``S + n`` (its
    #: restore tokens at ``S .. S+n-1``); ``None`` otherwise.
    next_position: int | None = None
    #: Where the scorer's pre-RoPE keys / queries came from (:mod:`kvbench.eviction.prerope`): ``hidden_states``
    #: (recomputed from the layers' input, as kvpress), ``unrotated`` (the stored states un-rotated: no hidden states
    #: for that layer), ``mixed``; ``None`` for a scorer that reads none.
    prerope_states: str | None = None
    #: The learned weights that scored the prompt (KVzap's checkpoint: ``source`` -- ``hub-cache``, ``folder`` or
    #: ``shipped``, kvbench's small CPU-trained ones --, ``path``, ``sha256``, and a shipped one's ``training``);
    #: ``None`` for a scorer without learned weights.
    learned_weights: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)
