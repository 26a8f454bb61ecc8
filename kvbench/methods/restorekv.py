"""RestoreKV (arXiv 2608.01247): learned restore tokens on top of KVzip, budget-matched.

Reproduces NVIDIA/kvpress ``kvpress/presses/restorekv_press.py`` (``RestoreKVPress``, kvpress 0.5.5, a
``KVzipPress``):

1. KVzip's scoring (:mod:`kvbench.methods.kvzip`: the prompt prefilled whole, then replayed chunk by chunk; each
   prompt token's score is its largest replay attention);
2. once every chunk is scored and before anything is evicted, ONE forward of the ``n`` learned restore embeddings
   (``inputs_embeds`` ``[1, n, hidden]``, cast to the model dtype) at positions ``S .. S+n-1`` over the whole cache,
   with the checkpoint's LoRA adapter active only during it (forward hooks on the adapted ``Linear`` modules,
   :func:`kvbench.eviction.restore_weights.lora_applied`), nothing scored: the restore tokens' keys and values are
   appended to every layer and head, and never evicted (:mod:`kvbench.inference.restore`);
3. KVzip's eviction of the prompt's tokens with the budget lowered by the ``n`` restore slots per layer and head:
   kvpress's ``compression_ratio`` c becomes ``min(1, c + n / S)`` (``budget=<c>cr``: ``int(L H S min(1, c + n/S))``
   evicted, ``int(H S ...)`` per layer when layerwise), any other budget keeps ``T H - n L H`` prompt tokens (``T``
   its total per head over the layers; ``<m>/layer``: ``(m - n) H`` per layer).  A budget of at most ``n`` tokens per
   layer and head keeps no prompt token, and still the ``n`` restore tokens (kvpress at ``c + n/S >= 1`` too).

The tokens after the prompt (the question in question-agnostic mode, the answer) are fed from position ``S + n``
(the record's ``next_position``).  In question-aware mode the prompt ends with the question, so the first answer
token is predicted by the prompt's last forward, before the restore pass (kvpress appends the question after it).

Weights (``checkpoint``, :mod:`kvbench.eviction.restore_weights`): ``auto`` -- kvpress's
``higokri/RestoreKV-<model>`` from the local Hugging Face cache, else kvbench's small CPU-trained weights for the
model (``models/restorekv/``, ``scripts/train_restorekv.py``, **not the authors'**) --, or a folder in the
published format (a PEFT LoRA adapter and ``restore_embeddings.safetensors``), checked before the model loads.
Every prediction row records them (``cache.learned_weights``); the restore pass counts as one of the
``extra_forwards``.  Not reproduced: ``kvzip_plus_normalization`` (as ``kvzip``).  Parity:
``tests/methods/test_restorekv.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from kvbench.eviction.restore_weights import RestoreWeights, resolve_restore
from kvbench.methods.kvzip import KVzip


@dataclass(frozen=True)
class RestoreKV(KVzip, family="restorekv", reference="NVIDIA/kvpress kvpress/presses/restorekv_press.py@0.5.5"):
    """KVzip's scores, a LoRA-adapted pass of learned restore tokens kept in the budget (module docstring)."""

    #: ``auto`` (module docstring), a checkpoint folder, or a Hub id in the local Hugging Face cache.
    checkpoint: str = "auto"

    #: The session runs :func:`kvbench.inference.restore.restore_pass` after the replay, before the eviction.
    restores_context: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.checkpoint != "auto":  # a named checkpoint is read (and checked) before any model is loaded
            resolve_restore(self.checkpoint, "")

    def restore_weights(self, name_or_path: str) -> RestoreWeights:
        """The weights this method uses for a model called ``name_or_path`` (read once per process)."""
        return resolve_restore(self.checkpoint, str(name_or_path))

    def learned_weights(self, module: Any) -> dict[str, Any]:
        """What a prediction row records about the weights used on ``module``'s model."""
        return dict(self.restore_weights(module.config.name_or_path).provenance)
