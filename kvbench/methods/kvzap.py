"""KVzap (Jegou et al., 2026, arXiv 2601.07891): a learned surrogate of KVzip+ scores every KV pair from the hidden
states, with no attention statistics and no replay.

Reproduces NVIDIA/kvpress ``kvpress/presses/kvzap_press.py`` (``KVzapPress``, a ``ScorerPress``, kvpress 0.5.5): at
each layer the score of token ``t`` for KV head ``h`` is the layer's surrogate model (``linear`` or ``mlp``,
:mod:`kvbench.eviction.surrogates`) applied to the layer's attention input -- the hidden states after
``input_layernorm`` -- in the model dtype; no token is protected; each head keeps the top of its scores.  kvpress's
``compression_ratio`` c is the budget ``<max(1, int(S (1 - c)))>/layer``.  The hidden states are those the session
keeps for pre-RoPE scorers (:mod:`kvbench.inference.hidden_states`); the model layer index (not the rank among
compressible layers) picks the module, so a sliding-window model's full-attention layers read their own modules.

Weights: ``checkpoint`` (``auto``: kvpress's ``nvidia/KVzap-<type>-<model>`` from the local Hugging Face cache, else
kvbench's small CPU-trained checkpoint for the model; or a folder / a cached Hub id).  Every prediction row records
the checkpoint that scored it (``cache.learned_weights``).

KVzap is designed for kvpress's ``DMSPress`` (a score threshold instead of a budget, prefill and decoding), which
this method does not include; :meth:`KVzap.score_hidden` scores any tokens from their hidden states for such a wrapper.
kvpress's ``DecodingPress`` cannot run KVzap (it scores a buffer of hidden states against the whole
cache), so ``decode_interval`` is refused.  Parity: ``tests/methods/test_kvzap.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvbench.eviction.base import PromptRows, WindowObservation
from kvbench.eviction.params import choice
from kvbench.eviction.recipe import ScorerMethod
from kvbench.eviction.surrogates import MODEL_TYPES, KVzapWeights, resolve_kvzap


@dataclass(frozen=True)
class KVzap(ScorerMethod, family="kvzap", reference="NVIDIA/kvpress kvpress/presses/kvzap_press.py@0.5.5"):
    """Scores from a learned surrogate on each layer's hidden states (module docstring)."""

    #: The surrogate: ``linear`` or ``mlp`` (kvpress's ``model_type``, default ``mlp``).
    model_type: str = choice("mlp", MODEL_TYPES)
    #: ``auto`` (module docstring), a checkpoint folder, or a Hub id in the local Hugging Face cache.
    checkpoint: str = "auto"

    def __post_init__(self) -> None:
        if self.checkpoint != "auto":  # a named checkpoint is read (and checked) before any model is loaded
            self.weights("")
        if self.decode_interval:
            raise ValueError(
                "method.params.decode_interval: kvzap scores tokens from their own hidden states, which kvpress's "
                "DecodingPress does not keep for the whole cache (it cannot run KVzapPress either); valid: 0"
            )

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """Every prompt row's hidden states (the layer's attention input)."""
        return PromptRows(hidden_states=True)

    def weights(self, name_or_path: str) -> KVzapWeights:
        """The checkpoint this method uses for a model called ``name_or_path`` (read once per process)."""
        return resolve_kvzap(self.checkpoint, self.model_type, str(name_or_path))

    def score_hidden(self, hidden_states: torch.Tensor, layer_idx: int, name_or_path: str) -> torch.Tensor:
        """``[H_kv, n]`` scores of ``n`` tokens of model layer ``layer_idx`` from their attention input
        ``hidden_states`` ``[n, hidden]``, in its dtype."""
        return self.weights(name_or_path).scores(layer_idx, hidden_states)

    def learned_weights(self, module: Any) -> dict[str, Any]:
        """What a prediction row records about the checkpoint used on ``module``'s model."""
        return dict(self.weights(module.config.name_or_path).provenance)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]``: the surrogate's scores (KV heads, repeated over a GQA group when query heads are stored)."""
        states = observation.prerope
        hidden = getattr(states, "hidden_states", None)
        module = getattr(states, "module", None)
        if hidden is None or module is None:
            raise ValueError(
                "kvzap scores the layers' hidden states: it needs a model whose attention modules kvbench can hook "
                "(q_proj/k_proj or qkv_proj), run through kvbench's prefill"
            )
        scores = self.score_hidden(hidden, int(module.layer_idx), module.config.name_or_path)
        heads = observation.num_heads
        if scores.shape[0] != heads:
            if heads % scores.shape[0]:
                raise ValueError(f"kvzap: {scores.shape[0]} scored KV heads cannot fill {heads} stored heads")
            scores = scores.repeat_interleave(heads // scores.shape[0], dim=0)
        return scores
