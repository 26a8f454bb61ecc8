"""Presses chained: NVIDIA/kvpress 0.5.5's ``ComposedPress`` (issue #58); ThinK is one fixed instance of it.

Reproduces ``kvpress/presses/composed_press.py``: the stages compress one after the other, each on what the previous
one kept.  ``method=composed method.params.stages=[snapkv_kvpress,knorm] method.params.ratios=[0.5]``:

* ``stages`` -- method presets (``conf/method/<name>.yaml``, or a one-class method's default preset: ``knorm``),
  each a plain scorer recipe (a scorer, uniform budgets, nothing while decoding: kvpress's ``ScorerPress``; kvpress
  refuses AdaKV and KVzip inside ``ComposedPress`` too), with its own window, protection and GQA reduction;
* ``ratios`` -- kvpress's ``compression_ratio`` of every stage but the last: stage ``i`` keeps
  ``max(1, int(n_{i-1} (1 - r_i)))`` of the ``n_{i-1}`` tokens the previous stage kept (``n_0 = S``), per head,
  its top by its own scores (its protected tokens first);
* the budget -- what the last stage keeps (``64L``: 64 tokens per layer and head, what is stored); where the stages
  before it kept fewer, the layer keeps those (the run records the count).  kvpress's composed ratio is
  ``1 - prod(1 - r_i)``: ``ComposedPress([A(r1), B(r2)])`` is ``ratios=[r1]`` with the budget
  ``<max(1, int(n_1 (1 - r2)))>/layer``.

Each stage scores the survivors of the previous one: their keys and values ``[H, n, D]`` in position order, and the
whole observation window's queries (kvpress: the layer's hidden states, which compression does not touch).  kvpress
hands a later stage the survivors in its predecessor's top-k order, kvbench in position order: the same scores for a
stage that scores each token on its own (KNorm, the attention of fixed queries), not for one that reads the order
(StreamingLLM's sinks, a window's causal mask).  A stage that reads more than the stored keys and values (prompt
rows, pre-RoPE states) is refused after the first stage, as kvpress warns.  A last stage that prunes key channels
(``think``: SnapKV then ThinK's channels) prunes them after the tokens, as in ``method=think``.
Parity: ``tests/methods/test_composed.py`` (recordings ``ComposedPress_*``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from omegaconf import OmegaConf, open_dict

from kvbench.eviction.base import (
    EvictionMethod,
    HeadBudgetAllocator,
    PromptRows,
    TokenScorer,
    UniformHeadAllocator,
    UniformLayerAllocator,
    WindowObservation,
    build_method,
)
from kvbench.eviction.family import FamilyMethod, family_class
from kvbench.eviction.threshold import ThresholdScorer
from kvbench.eviction.token_scores import aggregate_groups

REFERENCE = "NVIDIA/kvpress kvpress/presses/composed_press.py@0.5.5 (ComposedPress)"
#: The session knobs each stage holds (its preset's), not the composed preset.
STAGE_KNOBS = frozenset({"window", "window_in_budget", "gqa_agg", "sink_tokens", "decode_eviction"})


def stage_method(name: str, gqa_granularity: str) -> EvictionMethod:
    """The method of one stage: the preset ``conf/method/<name>.yaml`` or a family's default preset, stored as
    ``gqa_granularity``; ``ValueError`` naming the valid choices for an unknown name."""
    from kvbench.config import MethodConfig
    from kvbench.resources import conf_dir

    path = conf_dir() / "method" / f"{name}.yaml"
    if path.is_file():
        raw = OmegaConf.load(path)
        raw.pop("defaults", None)
        node = OmegaConf.merge(OmegaConf.structured(MethodConfig), raw)
    elif family_class(name) is not None:
        node = OmegaConf.merge(OmegaConf.structured(MethodConfig), {"name": name, "family": name})
    else:
        presets = sorted(p.stem for p in (conf_dir() / "method").glob("*.yaml"))
        raise ValueError(
            f"method.params.stages: {name!r} is neither a method preset ({', '.join(presets)}) nor a family"
        )
    with open_dict(node):
        node.params = {**(node.params or {}), "gqa_granularity": gqa_granularity}
    return build_method(node)


def top_slots(scores: torch.Tensor, protected: torch.Tensor, count: int) -> torch.Tensor:
    """``[H, count]`` ascending: per head the ``count`` best slots of ``scores`` ``[H, n]``, protected ones first,
    equal scores to the later slot (the eviction session's ranking)."""
    width = scores.shape[1]
    ranked = torch.where(protected, torch.inf, scores.float())
    recency = torch.arange(width, device=scores.device).flip(0)  # the later slot first among equals
    order = ranked[:, recency].argsort(dim=1, descending=True, stable=True)
    return recency[order[:, :count]].sort(dim=1).values


class ComposedScorer(TokenScorer):
    """Stages chained over one layer (module docstring): the scores the session ranks are the last stage's on the
    tokens every earlier stage kept (``+inf`` for its protected ones), ``-inf`` elsewhere."""

    def __init__(self, stages: Sequence[EvictionMethod], ratios: Sequence[float]) -> None:
        self.stages, self.ratios = tuple(stages), tuple(ratios)

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        return self.stages[0].scorer.prompt_rows(model_dtype)  # type: ignore[union-attr]

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H, S]`` float32 (module docstring)."""
        heads, length = observation.keys.shape[:2]
        alive = torch.arange(length, device=observation.keys.device).expand(heads, -1)  # [H, n] slots, ascending
        for index, stage in enumerate(self.stages):
            last = index == len(self.stages) - 1
            count = observation.layer_budget if last else max(1, int(alive.shape[1] * (1 - self.ratios[index])))
            scorer = stage.scorer
            assert scorer is not None
            seen = self._seen_by(observation, None if index == 0 else alive, stage.window, count)
            scores = aggregate_groups(scorer.score(seen).float(), heads, stage.gqa_agg)  # [H, n]
            protected = alive < stage.sink_tokens
            if stage.keep_window:
                protected = protected | (alive >= length - stage.window)
            if last:
                final = torch.full((heads, length), float("-inf"), device=scores.device)
                return final.scatter(1, alive, torch.where(protected, torch.inf, scores))
            alive = alive.gather(1, top_slots(scores, protected, min(int(count or 1), alive.shape[1])))
        raise AssertionError("a composed method has at least one stage")

    @staticmethod
    def _seen_by(
        observation: WindowObservation, alive: torch.Tensor | None, window: int, budget: int | None
    ) -> WindowObservation:
        """What a stage sees: the last ``window`` window queries, its own budget and, after the first stage, the
        survivors' keys and values only (``alive`` ``[H, n]``)."""
        changes: dict[str, Any] = {"queries": observation.queries[:, -window:], "layer_budget": budget}
        if alive is not None:
            index = alive[..., None].expand(-1, -1, observation.keys.shape[-1])
            changes |= {"keys": observation.keys.gather(1, index), "values": observation.values.gather(1, index)}
            changes |= {"prompt_queries": None, "prompt_column_sums": None, "prerope": None}
        seen = dataclasses.replace(observation, **changes)
        seen._stats = {}  # statistics of other queries or keys do not hold
        return seen


class SurvivorsAllocator(HeadBudgetAllocator):
    """Each head keeps the layer budget, or every token the earlier stages left it (those not scored ``-inf``)."""

    def allocate(self, scores: torch.Tensor, budget_per_head: int) -> list[int]:
        return [min(budget_per_head, int(count)) for count in (scores > float("-inf")).sum(dim=1).tolist()]


@dataclasses.dataclass(frozen=True)
class Composed(FamilyMethod, family="composed"):
    """ComposedPress's knobs: the stage presets and the ratios of all but the last (module docstring)."""

    #: The presets chained, first to last (kvpress's ``presses``).
    stages: Any = ("snapkv_kvpress", "knorm")
    #: kvpress's ``compression_ratio`` of every stage but the last (the last keeps the budget), each in ``[0, 1)``.
    ratios: Any = (0.5,)

    def build(self, method_cfg: Any) -> EvictionMethod:
        """The stages built from their presets, chained by :class:`ComposedScorer`."""
        names, ratios = [str(name) for name in self.stages], [float(ratio) for ratio in self.ratios]
        if not names or len(ratios) != len(names) - 1 or not all(0 <= ratio < 1 for ratio in ratios):
            raise ValueError(
                f"method.params.stages={names} and ratios={ratios}: one ratio in [0, 1) per stage but the last "
                "(the last stage keeps the budget), e.g. stages=[snapkv_kvpress,knorm] ratios=[0.5]"
            )
        stages = [stage_method(name, str(self.gqa_granularity)) for name in names]
        for index, (name, stage) in enumerate(zip(names, stages, strict=True)):
            self._check_stage(name, stage, first=index == 0, last=index == len(stages) - 1)
        return EvictionMethod(
            name=str(method_cfg.name),
            family=self.family,
            scorer=ComposedScorer(stages, ratios),
            layer_allocator=UniformLayerAllocator(),
            head_allocator=SurvivorsAllocator(),
            window=max(stage.window for stage in stages),
            keep_window=False,
            gqa_granularity=str(self.gqa_granularity),
            ignored_knobs=STAGE_KNOBS,
            key_channel_pruner=stages[-1].key_channel_pruner,
            settings={
                "stages": names,
                "ratios": ratios,
                "stage_settings": {name: stage.settings for name, stage in zip(names, stages, strict=True)},
                "reference": REFERENCE,
            },
        )

    @staticmethod
    def _check_stage(name: str, stage: EvictionMethod, *, first: bool, last: bool) -> None:
        """A stage is a plain scorer recipe (module docstring); only the first reads prompt rows, only the last
        prunes key channels."""
        problem = None
        if stage.scorer is None or stage.decode_policy is not None or stage.value_merger is not None:
            problem = "it must score tokens at the prefill and do nothing while decoding"
        elif type(stage.layer_allocator) is not UniformLayerAllocator or type(stage.head_allocator) is not (
            UniformHeadAllocator
        ):
            problem = "it allocates its own budgets (kvpress refuses AdaKVPress inside ComposedPress)"
        elif isinstance(stage.scorer, ThresholdScorer):
            problem = "it evicts by a threshold (a stage keeps a share of what it sees)"
        elif getattr(stage.scorer, "replays_context", False):
            problem = "it scores by replaying the context (kvpress refuses KVzipPress inside ComposedPress)"
        elif not first and stage.scorer.prompt_rows(torch.float32) != PromptRows():
            problem = "it reads the prompt rows, which a later stage does not see (only the first stage may)"
        elif stage.key_channel_pruner is not None and not last:
            problem = "it prunes key channels, which only the last stage may"
        if problem is not None:
            raise ValueError(f"method.params.stages: {name!r} cannot be a stage of a composed method: {problem}")
