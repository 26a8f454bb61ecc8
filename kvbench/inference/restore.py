"""RestoreKV's restore pass (:mod:`kvbench.methods.restorekv`): after KVzip's replay forwards scored the prompt and
before anything is evicted, one forward of the checkpoint's ``n`` restore embeddings at positions ``S .. S+n-1`` on
top of the prompt's whole cache, with the LoRA adapter on (forward hooks, removed after), through kvbench's own
forward, cache and attention; the session's ``restore`` phase scores nothing and the restore tokens' keys and values
stay in the cache.  The session then evicts the prompt's tokens with ``n`` slots per layer and head set aside
(:meth:`~kvbench.inference.session_passes.SessionPasses.compress_replayed`) and feeds what follows from ``S + n``.
"""

from __future__ import annotations

from typing import Any

import torch

from kvbench.eviction.restore_weights import lora_applied
from kvbench.inference.eviction import EvictionSession


def restore_pass(model: Any, session: EvictionSession, context: int, device: torch.device, forward: Any) -> None:
    """Append the restore tokens of ``session``'s scorer on top of the ``context`` prompt tokens (module docstring);
    ``forward`` is the prefill's forward wrapper (:func:`kvbench.inference.prefill.forward_logits`)."""
    weights = session.method.scorer.restore_weights(model.config.name_or_path)  # type: ignore[union-attr]
    embeddings = weights.embeddings.to(device=device, dtype=model.dtype)[None]  # [1, n, hidden]
    count = weights.num_tokens
    if embeddings.shape[-1] != model.config.hidden_size:
        raise ValueError(
            f"RestoreKV checkpoint {weights.provenance['path']}: restore embeddings of width {embeddings.shape[-1]}, "
            f"the model's hidden size is {model.config.hidden_size}"
        )
    session.phase = "restore"
    try:
        with lora_applied(model, weights):
            forward(model, embeddings, context, session.cache, session, device)
    finally:
        session.phase = "compress"
    session.restored_tokens = count
    session.next_position = context + count
    session.record.next_position = context + count
    session.record.learned_weights = dict(weights.provenance)
    session._note_bytes(prefill=True)
