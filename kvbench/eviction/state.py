"""What a method's pieces are and what a sample accumulates, kept apart (issue #41 item 4).

* :class:`ReadOnlyAfterBuild` -- a piece of a built method (scorer, allocators, decode policy) is read-only: the
  method (:class:`~kvbench.eviction.base.EvictionMethod`) is a frozen recipe, shared by every sample of a run, batched
  or not, and never copied.
* :class:`AllocatorState` -- one sample's layer-allocation state (``LayerBudgetAllocator.new_state``).
* :class:`DecodeState` -- one sample's decode-time state (``DecodePolicy.new_state``): per layer, the caps ``[H]``
  and the running scores ``[H, C]`` as tensors, so several samples' states can be stacked into batch tensors.

Both states are owned by the sample's :class:`~kvbench.inference.eviction.EvictionSession`.  What spans a dataset
(XKV's sampled mode: :class:`~kvbench.methods.xkv.XKVCalibration`) is created once per dataset by the runner
(``LayerBudgetAllocator.new_dataset_state``) and passed to every session (``AllocatorState.dataset``).  Random
draws are seeded per sample (:mod:`kvbench.eviction.seeding`): a built piece that holds a generator is refused.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

#: What a frozen recipe may not hold: random generators, whose draws would continue from sample to sample and
#: dataset to dataset (a resumed or batched run would then draw otherwise).  Seed per sample instead
#: (:mod:`kvbench.eviction.seeding`) or keep the state in a sample's or dataset's state object.
RUN_STATE_TYPES: tuple[type, ...] = (random.Random, np.random.Generator, np.random.RandomState, torch.Generator)


class ReadOnlyAfterBuild:
    """A method piece that is part of a frozen recipe: :class:`EvictionMethod` freezes its pieces when it is built,
    after which setting an attribute raises.  What a sample accumulates lives in state objects the pieces create
    (:meth:`LayerBudgetAllocator.new_state`, :meth:`DecodePolicy.new_state`), owned by the sample's
    :class:`~kvbench.inference.eviction.EvictionSession`."""

    _frozen: bool = False

    def freeze(self) -> None:
        """Make the piece read-only (idempotent); a piece holding a random generator (:data:`RUN_STATE_TYPES`) is
        refused: its draws would be state carried from sample to sample."""
        for name, value in vars(self).items():
            if isinstance(value, RUN_STATE_TYPES):
                raise TypeError(
                    f"{type(self).__name__}.{name} is a {type(value).__name__}: a built method is a frozen recipe and "
                    "holds no random generator (its draws would run on from sample to sample); seed per sample "
                    "(kvbench.eviction.seeding) or keep it in the sample's or dataset's state (new_state, "
                    "new_dataset_state)"
                )
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if self._frozen:
            raise AttributeError(
                f"cannot set {type(self).__name__}.{name}: a built method is a frozen recipe; a sample's state "
                "belongs to its EvictionSession (new_state)"
            )
        super().__setattr__(name, value)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A frozen piece is shared, never copied (nothing in it changes); an unfrozen one is copied as usual."""
        if self._frozen:
            return self
        copied = copy.copy(self)
        memo[id(self)] = copied
        for name, value in vars(self).items():
            object.__setattr__(copied, name, copy.deepcopy(value, memo))
        return copied


@dataclass
class AllocatorState:
    """One sample's layer-allocation state: created by :meth:`LayerBudgetAllocator.new_state` at the sample's first
    compressed layer and owned by its :class:`~kvbench.inference.eviction.EvictionSession` (the allocator itself is
    part of the frozen recipe).  Allocators with more to remember subclass it.

    Attributes
    ----------
    total:
        Tokens per stored head summed over ``num_layers`` layers.
    num_layers, context_length:
        Compressible layers, and the compressed prompt's length.
    budgets:
        Per layer, the budget planned so far (a static allocator plans every layer at once).
    dataset:
        The per-dataset state (:meth:`LayerBudgetAllocator.new_dataset_state`) the sample reads and adds to, or
        ``None`` for an allocator that has none.
    """

    total: int
    num_layers: int
    context_length: int
    budgets: list[int] = field(default_factory=list)
    dataset: Any = None


@dataclass
class DecodeState:
    """One sample's decode-time state, per compressible model layer: created by :meth:`DecodePolicy.new_state` and
    owned by the sample's :class:`~kvbench.inference.eviction.EvictionSession` (the policy is part of the frozen
    recipe).  Plain tensors, so several samples' states can be stacked into batch tensors.

    Attributes
    ----------
    caps:
        Per layer, ``[H]`` int64 (host) the most tokens each stored head keeps while decoding.
    scores:
        Per layer, ``[H, C]`` float32 running scores by storage slot (score-driven policies; ``C`` >= the longest
        head, grown by 1/8 when a head outgrows it).
    scored:
        Per layer, ``[H]`` how many slots of each head are scored (the rest were appended since the last step and
        start at 0).
    """

    caps: dict[int, torch.Tensor] = field(default_factory=dict)
    scores: dict[int, torch.Tensor] = field(default_factory=dict)
    scored: dict[int, torch.Tensor] = field(default_factory=dict)
    #: The budget's score threshold (``<t>thr``: a threshold method's decode policy evicts by it), else ``None``.
    threshold: float | None = None
    #: Per layer, the caps tensor last read and its host list (caps are set, never changed in place: a decoding step
    #: reads them without a ``tolist``).
    _host_caps: dict[int, tuple[torch.Tensor, list[int]]] = field(default_factory=dict, repr=False, compare=False)
    #: The model's rotary tables (:attr:`~kvbench.eviction.observation.WindowObservation.rotary`), set by the session
    #: (``None``: unknown, or no RoPE); a policy that re-rotates buffered queries reads them.
    rotary: Callable[[torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]] | None = field(
        default=None, repr=False, compare=False
    )

    def layer_caps(self, layer_idx: int) -> list[int]:
        """The layer's per-head caps as host integers (read once per caps tensor)."""
        caps = self.caps[layer_idx]
        cached = self._host_caps.get(layer_idx)
        if cached is None or cached[0] is not caps:
            cached = self._host_caps[layer_idx] = (caps, caps.tolist())
        return list(cached[1])


def stack_decode_states(batch: DecodeState | None, sample: DecodeState) -> DecodeState:
    """``batch`` (the states of a decode batch's samples so far, rows stacked sample after sample) with ``sample``'s
    rows added last: per layer the caps ``[R]`` and ``scored`` ``[R]`` concatenated, the scores ``[R, C]`` padded
    with zeros to the widest (slots past ``scored`` are unscored, whatever they hold)."""
    if batch is None:
        return DecodeState(
            caps={k: v.clone() for k, v in sample.caps.items()},
            scores={k: v.clone() for k, v in sample.scores.items()},
            scored={k: v.long() for k, v in sample.scored.items()},
        )
    stacked = DecodeState()
    for layer_idx, caps in batch.caps.items():
        stacked.caps[layer_idx] = torch.cat([caps, sample.caps[layer_idx]])
    for layer_idx, scores in batch.scores.items():
        new = sample.scores[layer_idx]
        width = max(scores.shape[1], new.shape[1])
        stacked.scores[layer_idx] = torch.cat(
            [torch.nn.functional.pad(scores, (0, width - scores.shape[1])),
             torch.nn.functional.pad(new.to(scores.device), (0, width - new.shape[1]))]
        )  # fmt: skip
        stacked.scored[layer_idx] = torch.cat([batch.scored[layer_idx].long(), sample.scored[layer_idx].long()])
    return stacked


def split_decode_state(batch: DecodeState, first: int, count: int) -> tuple[DecodeState, DecodeState]:
    """Rows ``first .. first + count - 1`` of a stacked decode state (one sample's, as its own state) and the
    state of the other rows."""

    def part(tensor: torch.Tensor) -> torch.Tensor:
        return tensor[first : first + count].clone()

    def rest(tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat([tensor[:first], tensor[first + count :]])

    sample = DecodeState(
        caps={k: part(v) for k, v in batch.caps.items()},
        scores={k: part(v) for k, v in batch.scores.items()},
        scored={k: part(v) for k, v in batch.scored.items()},
    )
    others = DecodeState(
        caps={k: rest(v) for k, v in batch.caps.items()},
        scores={k: rest(v) for k, v in batch.scores.items()},
        scored={k: rest(v) for k, v in batch.scored.items()},
    )
    return sample, others
