"""Forwards a method runs on top of the prompt to score it, before anything is evicted: KVzip's context
reconstruction (:mod:`kvbench.methods.kvzip`), and RestoreKV's restore pass after it (:mod:`kvbench.inference.restore`).

After the compressed prompt is prefilled (every layer whole), the scorer's ``replay_passes`` give token sequences
(the repeat prompt followed by a chunk of the context) and the span of the prompt each one scores.  Each pass goes
through kvbench's own forward (:func:`kvbench.inference.prefill.forward_logits`), cache and attention function, at
the positions right after the prompt; the session's ``replay`` phase hands each layer's queries to the scorer
(``replay_scores``), then the pass's tokens are removed from the cache.  Once every pass is done, the session
evicts every layer at once (``select``).  The number of passes is recorded
(:attr:`~kvbench.inference.eviction.CacheRecord.extra_forwards`, in every prediction row's ``cache``); their seconds
are part of the sample's prefill seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvbench.inference.eviction import EvictionSession
from kvbench.inference.gradient_replay import replay_with_gradients
from kvbench.inference.restore import restore_pass


def replay_context(
    model: Any,
    session: EvictionSession,
    prompt_ids: Sequence[int],
    tokenizer: Any,
    device: torch.device,
    forward: Any,
) -> None:
    """Run the scorer's replay passes over the prefilled ``prompt_ids`` and compress (no-op unless the session's
    scorer replays the context, or when it already did).  ``forward`` is the prefill's forward wrapper."""
    if not session.replays or session.replayed:
        return
    if tokenizer is None and getattr(session.method.scorer, "replay_needs_tokenizer", True):
        raise ValueError(
            f"{session.method.family} scores the context by reconstructing it (a repeat prompt): it needs the "
            "tokenizer, which this caller did not give the prefill"
        )
    if session.cache.sliding_layers:
        raise ValueError(f"{session.method.family} does not support models with sliding-window layers")
    scorer = session.method.scorer
    passes = scorer.replay_passes(list(prompt_ids), tokenizer)  # type: ignore[union-attr]
    context = len(prompt_ids)
    if getattr(scorer, "needs_gradient", False):  # KVgrad: a backward per pass, outside inference mode
        replay_with_gradients(model, session, passes, context, device, forward)
    else:
        for replay_ids, start, end in passes:
            session.begin_replay(start, end)
            forward(model, replay_ids, context, session.cache, session, device)
            session.end_replay()
    restores = getattr(scorer, "restores_context", False)
    if restores:  # RestoreKV: the restore tokens' pass over the whole cache, before the eviction
        restore_pass(model, session, context, device, forward)
    session.compress_replayed()
    session.replayed = True
    session.record.extra_forwards = len(passes) + int(restores)
