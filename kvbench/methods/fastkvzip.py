"""Fast KVzip (Kim et al., 2026, arXiv 2601.17668): gates trained on KVzip's scores score every KV pair from the
hidden states, and KVzip's selection evicts the lowest over all layers and heads -- no replay.

Reproduces NVIDIA/kvpress ``kvpress/presses/fastkvzip_press.py`` (``FastKVzipPress``, kvpress 0.5.5):

1. during the prefill, each layer's gate (:class:`kvbench.eviction.surrogates.FastKVzipGates`) scores every prompt
   token per KV head from the layer's attention input (after ``input_layernorm``; float32 scores in ``(0, 1)``);
2. the first ``n_sink`` tokens and the last ``max(1, int(S window_ratio))`` (``window_size`` from 32,000 tokens on)
   are set to 1;
3. once every layer is scored, KVzip's selection (:func:`kvbench.methods.kvzip.top_scores`, without KVzip's
   ``max + 1`` for the sinks): the lowest scores over all layers and heads are evicted (``layerwise``: per layer).

Gates (``checkpoint``): ``auto`` -- the authors' ``Jang-Hyun/Fast-KVzip`` ``<model>/q<G>_dim16_sink16.pt`` from the
local Hugging Face cache (kvpress's rule), else kvbench's small CPU-trained gates for the model
(``models/fastkvzip/``, ``scripts/train_fastkvzip.py``) --, or a gate file.  Every prediction row records the file
(``cache.learned_weights``).  Like KVzip, all layers are scored before any is evicted (the session's replay path,
with no replay forward): not with a held last segment (``kvbench.press``) nor on sliding-window models (kvpress
skips Gemma-3's sliding layers; kvbench refuses by name).  Parity: ``tests/methods/test_fastkvzip.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvbench.eviction.base import PromptRows, WindowObservation
from kvbench.eviction.params import bounded
from kvbench.eviction.recipe import ScorerMethod
from kvbench.eviction.surrogates import FastKVzipGates, gate_file_name, resolve_gates
from kvbench.eviction.wrappers import refuse_prefill_wrappers
from kvbench.methods.kvzip import top_scores

#: From this many prompt tokens on, the protected window is ``window_size`` (kvpress's chunked-prefill threshold).
LONG_CONTEXT = 32000


@dataclass(frozen=True)
class FastKVzip(ScorerMethod, family="fastkvzip", reference="NVIDIA/kvpress kvpress/presses/fastkvzip_press.py@0.5.5"):
    """Learned gates on the hidden states, KVzip's global selection (module docstring)."""

    #: First tokens scored 1 (kept before any other).
    n_sink: int = bounded(4, 0)
    #: Every layer evicts the same number (kvpress's ``layerwise``); off: the lowest scores over all layers.
    layerwise: bool = False
    #: Last tokens scored 1 from ``LONG_CONTEXT`` prompt tokens on.
    window_size: int = bounded(4096, 1)
    #: Below ``LONG_CONTEXT`` tokens, the last ``max(1, int(S window_ratio))`` tokens are scored 1.
    window_ratio: float = bounded(0.02, 0.0, 1.0)
    #: ``auto`` (module docstring) or a gate file in the published format.
    checkpoint: str = "auto"

    #: Every layer is scored before any is evicted: the session's replay path (no replay forward, no tokenizer).
    replays_context: ClassVar[bool] = True
    replay_needs_tokenizer: ClassVar[bool] = False

    def __post_init__(self) -> None:
        refuse_prefill_wrappers(self, "fastkvzip", "splits the budget over layers and heads itself")
        if self.checkpoint != "auto":  # a named gate file is read (and checked) before any model is loaded
            resolve_gates(self.checkpoint, "", "")
        if self.decode_interval or self.keep_window:
            raise ValueError("fastkvzip evicts once after the prefill: decode_interval and keep_window must stay off")

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """Every prompt row's hidden states (the gates' input)."""
        return PromptRows(hidden_states=True)

    def gates(self, module: Any) -> FastKVzipGates:
        """The gates for ``module``'s model (read once per process)."""
        config = module.config
        name = gate_file_name(config.num_attention_heads, config.num_key_value_heads)
        return resolve_gates(self.checkpoint, str(config.name_or_path), name)

    def learned_weights(self, module: Any) -> dict[str, Any]:
        """What a prediction row records about the gate file used on ``module``'s model."""
        return dict(self.gates(module).provenance)

    def hidden_scores(self, hidden_states: torch.Tensor, module: Any) -> torch.Tensor:
        """``[H_kv, S]`` float32 scores of a layer's prompt from its attention input ``[S, hidden]``: the gate's, the
        sinks and the recent window set to 1."""
        scores = self.gates(module).scores(int(module.layer_idx), hidden_states)
        scores[:, : self.n_sink] = 1.0
        length = scores.shape[-1]
        window = max(1, int(length * self.window_ratio)) if length < LONG_CONTEXT else self.window_size
        scores[:, -window:] = 1.0
        return scores

    def replay_passes(self, prompt_ids: list[int], tokenizer: Any) -> list[tuple[list[int], int, int]]:
        """No replay forward: the prefill's hidden states are all the gates read."""
        return []

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """Not used: the session scores each layer from its hidden states (:meth:`hidden_scores`)."""
        raise NotImplementedError("fastkvzip scores the prompt from the layers' hidden states during the prefill")

    def select(
        self,
        scores: list[torch.Tensor],
        kept: int,
        per_layer: int | None,
        prefix: int = 0,
        layer_kept: int | None = None,
    ) -> list[list[torch.Tensor]]:
        """Per layer, per head, the kept token indices (sorted): KVzip's selection on the gate scores as they are
        (``layer_kept``: kvpress's count of a layer under ``<c>cr`` with ``layerwise``)."""
        return top_scores(torch.stack(scores), kept, per_layer, self.layerwise, layer_kept)
