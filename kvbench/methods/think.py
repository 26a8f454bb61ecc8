"""ThinK (Xu et al., 2024, arXiv 2407.21018): prune the key channels that matter least, on top of any token method.

``method=think`` runs a token method (``method.params.tokens``, default ``snapkv`` with kvpress's SnapKVPress knobs,
``conf/method/think.yaml``) and then, per layer, keeps ``D - int(D r)`` of the ``D`` key channels of each stored head
(``r`` = ``method.params.key_channel_compression_ratio``, default 0.5).  The channel scores reproduce NVIDIA/kvpress
``kvpress/presses/think_press.py`` (``ThinKPress``, kvpress 0.5.5, reviewed by ThinK's first author): the squared
queries of the last ``channel_window`` (32) prompt tokens averaged over those tokens and over each GQA group, times
the squared kept keys averaged over the tokens, in the model dtype; the ``int(D r)`` lowest scores are pruned
(``torch.topk(largest=False)``).  The composition order is kvpress's ``ComposedPress([SnapKVPress, ThinKPress])``:
the channels are scored on the keys the token method kept.

What differs from kvpress, by design (docs/methods/think.md):

* kvpress zeroes the pruned channels and keeps the key tensor's shape ("no memory gain"); kvbench removes them:
  the layer stores the compressed context's keys as ``[S, D_k]`` per head
  (:meth:`kvbench.cache.base.EvictableLayer.prune_key_channels`, both backends); ``stored_bytes`` counts ``(D_k + D)``
  bytes per context token and head.
* The tokens stored after the pruning (a question appended in question-agnostic mode, generated tokens) are kept
  whole, as kvpress appends them (its hook only runs during the prefill): their pruned channels are stored aside
  (:class:`kvbench.cache.appended_keys.AppendedKeyChannels`, counted as ``2 D`` bytes per token and head), and the
  layer hands attention full-width keys whose context rows are zero in the pruned channels: kvpress's key tensor,
  one softmax with the full query (a per-step torch gather; the paged backend's attention plan records it as
  ``torch_gather``, reason "pruned key channels (appended keys kept whole)").  ``method.params.prune_appended=true``
  (kvbench's switch, off by default) stores every later token with the kept channels only (one key width per layer,
  less memory); attention then uses the matching query channels at the model's scale.
* ``gqa_granularity=query_head`` scores channels per query head (kvpress: per KV head, the default here).

ThinK's own code (SalesforceAIResearch/ThinK@4243c26, ``ThinK_flash/src/kv_pruning_utils.py``
``key_pruner_query_driven``) scores channels with the same formula on keys repeated per query head and keeps the last
``recent_size`` (32) keys whole; kvbench follows kvpress's reading (reviewed by ThinK's first author).

Other knobs go to the token method: ``method=think method.params.tokens=knorm method.params.allocation=ada`` (its
own params ride along in ``method.params``; the common knobs it does not read must be back at their defaults).
Parity: ``tests/methods/test_think.py`` (recordings: ``tests/fixtures/reference/think/``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from omegaconf import open_dict

from kvbench.config import SESSION_KNOBS
from kvbench.eviction.base import METHOD_FAMILIES, EvictionMethod, build_method
from kvbench.eviction.channels import KeyChannelPruner
from kvbench.eviction.family import FamilyMethod, family_class
from kvbench.eviction.params import bounded, parse_params

REFERENCE = "NVIDIA/kvpress kvpress/presses/think_press.py@0.5.5 (ThinKPress; ThinK: SalesforceAIResearch/ThinK)"


def think_kept_channels(queries: torch.Tensor, keys: list[torch.Tensor], ratio: float) -> torch.Tensor | None:
    """The key channels ThinKPress keeps for each stored head.

    Parameters
    ----------
    queries:
        ``[H_q, W, D]`` post-RoPE queries of the last ``W`` prompt tokens (kvpress: 32).
    keys:
        Per stored head, its kept keys ``[S_h, D]``.
    ratio:
        Fraction of the ``D`` channels pruned (``int(D ratio)`` of them).

    Returns
    -------
    ``[H, D - int(D ratio)]`` int64 kept channels per head, ascending; ``None`` when nothing is pruned.
    """
    heads, dim = len(keys), queries.shape[-1]
    pruned = int(dim * ratio)
    if pruned == 0:
        return None
    query_norm = queries.pow(2).mean(dim=1)  # [H_q, D], in the model dtype as kvpress
    query_norm = query_norm.view(heads, queries.shape[0] // heads, dim).mean(1)  # [H, D]
    if len({int(k.shape[0]) for k in keys}) == 1:
        key_norm = torch.stack(keys).pow(2).mean(dim=1)  # [H, D]
    else:
        key_norm = torch.stack([k.pow(2).mean(dim=0) for k in keys])
    scores = query_norm * key_norm
    dropped = scores.topk(pruned, dim=-1, largest=False).indices  # [H, pruned]
    keep = torch.ones(heads, dim, dtype=torch.bool, device=scores.device).scatter(-1, dropped, False)
    return keep.nonzero()[:, 1].view(heads, dim - pruned)


class ThinKChannels(KeyChannelPruner):
    """ThinKPress's channel selection (:func:`think_kept_channels`) as a method piece."""

    def __init__(self, ratio: float, window: int, prune_appended: bool = False) -> None:
        self.ratio, self.window, self.prune_appended = ratio, window, prune_appended

    def kept_channels(self, queries: torch.Tensor, keys: list[torch.Tensor]) -> torch.Tensor | None:
        return think_kept_channels(queries, keys, self.ratio)


@dataclasses.dataclass(frozen=True)
class ThinK(FamilyMethod, family="think"):
    """ThinK's own knobs (``method.params``); every other key of ``method.params`` goes to the token method, the
    session knobs included (they are the token method's)."""

    unused_knobs: ClassVar[frozenset[str]] = frozenset(SESSION_KNOBS)

    #: The token method the channels are pruned on top of (a method family: snapkv, knorm, tova, ...).
    tokens: str = "snapkv"
    #: Fraction of key channels pruned (kvpress's ``key_channel_compression_ratio``; 0 prunes none).
    key_channel_compression_ratio: float = bounded(0.5, 0.0, 1.0)
    #: The last prompt queries that score the channels (kvpress's ``window_size``).
    channel_window: int = bounded(32, 1)
    #: kvbench's switch (off: kvpress): also store the tokens appended after the pruning (a question appended in
    #: question-agnostic mode, generated tokens) with the kept channels only, instead of whole.
    prune_appended: bool = False

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None) -> ThinK:
        """ThinK's knobs (its fields) from ``method.params``, validated; the other keys are left to the token method
        (which validates them when it builds)."""
        own = cls.field_knobs()
        return parse_params(cls, {key: value for key, value in (params or {}).items() if key in own}, "think")

    @classmethod
    def declared_knobs(cls, params: Mapping[str, Any] | None = None) -> list[str]:
        """ThinK's knobs and those of its token method (``params["tokens"]``, default snapkv; ThinK's own knobs are
        validated first, so a bad ``tokens`` is named as such)."""
        token_class = family_class(cls.from_params(params).token_family())
        return [*cls.field_knobs(), *(token_class.declared_knobs(params) if token_class is not None else [])]

    def token_family(self) -> str:
        """``tokens``, checked: a registered family other than ThinK (``ValueError`` naming the valid ones)."""
        if self.tokens == self.family:
            raise ValueError(
                "method.params.tokens='think' is not valid: ThinK prunes channels on top of a token method"
            )
        METHOD_FAMILIES.get(self.tokens)
        return self.tokens

    def build(self, method_cfg: Any) -> EvictionMethod:
        """ThinK over ``method.params.tokens``: that family's method (built from the same config, ThinK's knobs
        removed) with ThinK's key-channel pruning."""
        tokens, own = self.token_family(), self.field_knobs()
        token_cfg = copy.deepcopy(method_cfg)
        with open_dict(token_cfg):
            token_cfg.family = tokens
            token_cfg.params = {key: value for key, value in (method_cfg.params or {}).items() if key not in own}
        inner = build_method(token_cfg)
        return dataclasses.replace(
            inner,
            family=self.family,
            key_channel_pruner=ThinKChannels(
                self.key_channel_compression_ratio, self.channel_window, self.prune_appended
            ),
            settings={**inner.settings, **{key: getattr(self, key) for key in own}, "think_reference": REFERENCE},
        )
