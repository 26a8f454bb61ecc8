"""KVgrad (OpenReview cg1wTCJjjk): each KV pair scored by input x gradient attribution on the final hidden states,
over KVzip's context reconstruction.

Reproduces NVIDIA/kvpress ``kvpress/presses/kvgrad_press.py`` (``KVgradPress``, a ``KVzipPress``, kvpress 0.5.5):

1. the prompt is prefilled whole and cut into chunks of ``chunk_size`` (512) tokens replayed as KVzip replays them
   (:class:`~kvbench.methods.kvzip.KVzip`: the repeat prompt, the previous chunk's tail, the assistant suffix, the
   chunk), each on top of the prompt at the positions right after it;
2. each replay is one forward *with autograd* (the model's parameters frozen, the replay's input embeddings a leaf
   that requires grad, the prompt's cache read but never written: its replay tokens are removed afterwards) and one
   backward of ``Phi = sum_p ||h_p||^2`` over the replay's tokens, ``h`` the last decoder layer's output (before the
   final norm), in float32;
3. at each layer, for a token ``c`` of the chunk and a KV head, the score is the largest over the replay's queries
   ``p`` and the head's query group of ``A[p, c] * ||v_c W_O|| * ||grad_{a_p} Phi||``: ``A`` KVzip's replay
   attention (:meth:`~kvbench.methods.kvzip.KVzip.replay_attention`, model dtype), ``||v_c W_O||`` the norm of the
   value through the query head's slice of the output projection (model dtype), ``grad_{a_p} Phi`` the gradient of
   ``Phi`` at the layer's attention output (its contribution to the residual stream) for query ``p`` (float32 norm);
   the products promote to float32 and the maximum is stored in the model dtype;
4. selection as KVzip's: the first ``n_sink`` tokens get ``max + 1``, the lowest scores over all layers and heads are
   evicted (``layerwise``: per layer).

The backward runs outside the ``torch.inference_mode()`` generation runs under
(:mod:`kvbench.inference.gradient_replay`): the prompt's cache buffers are copied into ordinary tensors first.  It
costs one forward and one backward per chunk on top of the prefill (kvpress: 3-4 times the prefill), recorded as
``extra_forwards``.  kvbench removes the evicted tokens (kvpress masks them).  Parity: ``tests/methods/test_kvgrad.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.eviction.params import bounded
from kvbench.methods.kvzip import KVzip


@dataclass(frozen=True)
class KVgrad(KVzip, family="kvgrad", reference="NVIDIA/kvpress kvpress/presses/kvgrad_press.py@0.5.5"):
    """KVzip's replay with gradient attribution (module docstring)."""

    #: Prompt tokens reconstructed by one replay forward and backward (kvpress's default 512).
    chunk_size: int = bounded(512, 1)

    #: The session's replay stores :meth:`replay_attention` per layer and the gradient driver scores after the
    #: backward (:mod:`kvbench.inference.gradient_replay`).
    needs_gradient: ClassVar[bool] = True

    def gradient_scores(
        self,
        attention: torch.Tensor,
        values: torch.Tensor,
        output_projection: torch.Tensor,
        gradient_norm: torch.Tensor,
    ) -> torch.Tensor:
        """``[H, c]`` float32 scores of one layer's replayed span.

        ``attention``: ``[H, G, q, c]`` (:meth:`replay_attention`, model dtype); ``values``: ``[H, c, D]`` the span's
        stored values; ``output_projection``: ``[hidden, H G D]`` the layer's ``o_proj.weight``; ``gradient_norm``:
        ``[q]`` float32 norms of ``Phi``'s gradient at the layer's attention output.
        """
        heads, groups, _, _ = attention.shape
        dim = values.shape[-1]
        projection = output_projection.view(output_projection.shape[0], heads, groups, dim)
        value_norm = torch.einsum("j h g i, b h t i -> b h g t j", projection, values[None]).norm(dim=-1)[0]
        scores = attention * value_norm[:, :, None, :]  # [H, G, q, c], model dtype
        scores = scores * gradient_norm[None, None, :, None]  # float32
        return scores.amax(dim=(1, 2))
