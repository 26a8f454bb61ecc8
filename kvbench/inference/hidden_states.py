"""The layers' input hidden states during a compressing prefill, for the scorers that read pre-RoPE keys or queries
(:attr:`kvbench.eviction.base.PromptRows.prerope_keys`: Expected Attention, leverage scores, Compactor).

kvpress recomputes those states from the attention module's input (``k_proj`` / ``q_proj`` of its hidden states,
then the per-head ``k_norm`` / ``q_norm`` of Qwen3 and Gemma-3; ``qkv_proj`` slices for Phi-3).  kvbench does the
same: :func:`capture_hidden_states` registers a forward pre-hook (with keyword arguments, a public torch API; nothing
in transformers is patched) on each compressible decoder layer's ``self_attn`` whose layout it knows; the hook hands
the layer's ``hidden_states`` to the eviction session, which keeps them until the layer is compressed (one forward:
only the current layer's, which the model holds anyway; a chunked prefill: every chunk's, ``[S, hidden]`` per
layer) and then frees them.  The hooks are removed when the prefill ends (:meth:`EvictionSession.release_hooks`);
nothing is kept while decoding, and nothing is registered for a scorer that reads no pre-RoPE states.

A layer whose attention module has another layout (a norm over all heads at once, no projections) gets no hook:
its scorer un-rotates the stored states instead (:mod:`kvbench.eviction.prerope`), and the cache record says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from kvbench.inference.eviction import EvictionSession


def _head_norm(module: torch.nn.Module, name: str, head_dim: int) -> torch.nn.Module | bool | None:
    """The module's per-head norm ``name`` (``q_norm`` / ``k_norm``: a weight of ``head_dim``), ``None`` without
    one, ``False`` for a norm of another shape (a layout kvbench does not know)."""
    norm = getattr(module, name, None)
    if norm is None:
        return None
    weight = getattr(norm, "weight", None)
    if isinstance(norm, torch.nn.Module) and isinstance(weight, torch.Tensor) and tuple(weight.shape) == (head_dim,):
        return norm
    return False


def known_layout(module: torch.nn.Module) -> bool:
    """Whether :class:`ProjectedStates` can recompute ``module``'s pre-RoPE states as kvpress does: ``q_proj`` and
    ``k_proj`` (or Phi-3's ``qkv_proj``), an integer ``head_dim``, and per-head norms if any."""
    head_dim = getattr(module, "head_dim", None)
    if not isinstance(head_dim, int) or not isinstance(getattr(module, "layer_idx", None), int):
        return False
    projections = hasattr(module, "qkv_proj") or (hasattr(module, "q_proj") and hasattr(module, "k_proj"))
    norms = (_head_norm(module, "q_norm", head_dim), _head_norm(module, "k_norm", head_dim))
    return projections and False not in norms


@dataclass
class ProjectedStates:
    """Pre-RoPE keys and queries of one layer recomputed from its input ``hidden_states`` ``[S, hidden]`` through
    its attention ``module`` (kvpress's ``get_prerope_key_states`` / ``get_prerope_query_states``), in the model
    dtype; keys repeated ``expand`` times per KV head (query-head storage).  A
    :class:`kvbench.eviction.prerope.PreRopeStates`."""

    module: torch.nn.Module
    hidden_states: torch.Tensor
    expand: int = 1
    source: str = "hidden_states"

    def _project(self, first: int, last: int | None, keys: bool) -> torch.Tensor:
        return self._project_rows(
            self.hidden_states[None, first:last], keys
        )  # [1, n, hidden]: the rows kvpress projects

    def project_queries(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[H_q, n, D]`` pre-RoPE queries of arbitrary hidden rows ``[n, hidden]`` (kvpress's ``BlockPress`` projects
        rows it assembles from several tokens' hidden states)."""
        return self._project_rows(hidden[None], keys=False)

    def _project_rows(self, hidden: torch.Tensor, keys: bool) -> torch.Tensor:
        module, head_dim = self.module, int(self.module.head_dim)
        if hasattr(module, "qkv_proj"):  # Phi-3: queries, then keys, then values
            query_width = module.config.num_attention_heads * head_dim
            key_width = module.config.num_key_value_heads * head_dim
            fused = module.qkv_proj(hidden)
            states = fused[..., query_width : query_width + key_width] if keys else fused[..., :query_width]
        else:
            states = (module.k_proj if keys else module.q_proj)(hidden)
        states = states.view(1, hidden.shape[1], -1, head_dim).transpose(1, 2)
        norm = _head_norm(module, "k_norm" if keys else "q_norm", head_dim)
        if norm:
            states = norm(states)
        return states[0]

    def keys(self, first: int = 0, last: int | None = None) -> torch.Tensor:
        """``[H, n, D]`` pre-RoPE keys of positions ``first .. last - 1`` (``k_proj`` of those rows)."""
        keys = self._project(first, last, keys=True)
        return keys.repeat_interleave(self.expand, dim=0) if self.expand > 1 else keys

    def queries(self, first: int = 0, last: int | None = None) -> torch.Tensor:
        """``[H_q, n, D]`` pre-RoPE queries of positions ``first .. last - 1`` (``q_proj`` of those rows)."""
        return self._project(first, last, keys=False)


def attention_modules(model: PreTrainedModel) -> dict[int, torch.nn.Module]:
    """Layer index -> the decoder layer's ``self_attn`` module, for the layers whose layout :func:`known_layout`
    accepts (kvpress finds them the same way: ``model.layers[i].self_attn``)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        return {}
    modules = (getattr(layer, "self_attn", None) for layer in layers)
    return {int(m.layer_idx): m for m in modules if isinstance(m, torch.nn.Module) and known_layout(m)}


def capture_hidden_states(model: PreTrainedModel, session: EvictionSession) -> None:
    """Register the pre-hooks of the module docstring when ``session`` compresses with a scorer that reads pre-RoPE
    states or the hidden states themselves (its handles go to ``session.hooks``;
    :meth:`EvictionSession.release_hooks` removes them)."""
    scorer = session.method.scorer
    if scorer is None or not session.compresses:
        return
    needs = scorer.prompt_rows(model.dtype)
    if not needs.keeps_hidden_states or (session.replays and not needs.hidden_states):
        return

    def before_attention(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        owner = kwargs.get("kvbench_session")  # the session, or a shared prefill's fan-out over it (shared_prefill.py)
        if owner is not session and not any(other is session for other in getattr(owner, "sessions", ())):
            return  # a forward of another prompt (a stale hook)
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        session.take_hidden_states(module, hidden)

    for layer_idx, module in attention_modules(model).items():
        if layer_idx in session.compressible:
            session.hooks.append(module.register_forward_pre_hook(before_attention, with_kwargs=True))


def capture_decode_queries(model: PreTrainedModel, session: EvictionSession) -> None:
    """When the session's decode policy reads the pre-RoPE queries of the forwards after the prefill (kvpress's
    decoding presses buffer those hidden states: :attr:`~kvbench.eviction.base.DecodePolicy.reads_prerope_queries`),
    register forward pre-hooks that hand it ``q_proj`` of each compressible layer's hidden states (kvpress's
    ``get_prerope_query_states``, in the model dtype) while the sample decodes; removed by
    :meth:`EvictionSession.finish` (``session.decode_hooks``)."""
    policy = session.method.decode_policy
    if policy is None or not policy.reads_prerope_queries or session.budget.is_full:
        return

    def before_attention(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if kwargs.get("kvbench_session") is not session or session.phase not in ("append", "decode"):
            return
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        assert session.decode_state is not None
        queries = ProjectedStates(module, hidden[0].detach()).queries()  # [H_q, q, D]
        policy.take_prerope_queries(session.decode_state, int(module.layer_idx), queries)

    for layer_idx, module in attention_modules(model).items():
        if layer_idx in session.compressible:
            session.decode_hooks.append(module.register_forward_pre_hook(before_attention, with_kwargs=True))
