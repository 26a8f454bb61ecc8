"""The method interface: an eviction method is four small pieces that work on plain tensors.

* :class:`TokenScorer` -- the *indicator*: importance of every context token for one layer, from the observation
  window's queries against the keys (``[H, S]``, higher = keep).
* :class:`LayerBudgetAllocator` -- how the total budget is split over layers (uniform, pyramid, preference...).
  It is called layer by layer during prefill and may revise earlier layers' budgets (cascading, CAKE-style).
* :class:`HeadBudgetAllocator` -- how a layer's budget is split over its stored heads (uniform, Ada-KV top-B...).
* :class:`DecodePolicy` -- what happens to the cache while generating (nothing, StreamingLLM window, H2O, TOVA).

:class:`EvictionMethod` bundles them with the session knobs that govern how they are combined; a method's class
(:class:`kvbench.eviction.family.FamilyMethod`, one file per family under ``kvbench/methods/``) builds it from its
knobs and registers itself in :data:`METHOD_FAMILIES`.  None of the pieces needs
a model: tests drive them with hand-built tensors.  A built method is a frozen recipe: what a sample accumulates
(allocator state, decode caps, running scores) is created by the pieces (``new_state``) and owned by the sample's
session, what spans a dataset by ``LayerBudgetAllocator.new_dataset_state`` (:mod:`kvbench.eviction.state`).

Shapes use ``H_q`` query heads, ``H`` stored heads (KV heads, or query heads with ``gqa_granularity=query_head``),
``W`` window queries, ``S`` context tokens, ``D`` head dim.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kvbench.budget import Budget
from kvbench.config import MethodConfig, move_session_knobs
from kvbench.eviction.channels import KeyChannelPruner
from kvbench.eviction.knobs import check_unused_knobs
from kvbench.eviction.observation import PromptRows, WindowObservation
from kvbench.eviction.state import AllocatorState, DecodeState, ReadOnlyAfterBuild
from kvbench.eviction.token_scores import ScoreOptions, VoteKnobs
from kvbench.registry import Registry, submodule_importer

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer

LOG = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------- pieces
class TokenScorer(ReadOnlyAfterBuild, ABC):
    """Importance of each context token at one layer.

    ``unshared_prefill``: why a method with this scorer cannot share a sweep's prefill forward with other jobs
    (:mod:`kvbench.inference.shared_prefill`), ``None`` (the default) when it can: a scorer sees the prompt only
    through its session, after each layer's attention, so it cannot change what the prefill computes."""

    unshared_prefill: str | None = None

    #: Whether the scorer votes with the observation window's queries on the tokens before it and leaves the
    #: window's own columns to the session (SnapKV's vote): a wrapper that scores another token set (kvpress's
    #: ``BlockPress``, its decoding presses) gives it that set's queries and scores the window ``max + 1``, as
    #: kvpress's ``SnapKVPress`` pads its window.
    window_scorer: ClassVar[bool] = False

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """What :meth:`score` reads from the prompt rows before the window (default: nothing)."""
        return PromptRows()

    @abstractmethod
    def score(self, observation: WindowObservation) -> torch.Tensor:
        """Return ``[H, S]`` scores, one row per stored head (query heads where the method stores per query head,
        KV heads otherwise), higher = keep; ``[H_q, S]`` is accepted and reduced per GQA group by ``params.gqa_agg``.
        The session checks the shape (a clear error naming the scorer otherwise).

        Scores of the window tokens are ignored when the method keeps the window.
        """


class LayerBudgetAllocator(ReadOnlyAfterBuild, ABC):
    """Splits the total budget over layers: a frozen recipe; what a sample accumulates is its
    :class:`AllocatorState` (:meth:`new_state`), what a dataset accumulates (XKV's sampled mode) the object
    :meth:`new_dataset_state` returns."""

    def new_dataset_state(self, name: str, num_samples: int, finished: Sequence[dict[str, Any] | None] = ()) -> Any:
        """The state that spans the dataset ``name`` of ``num_samples`` samples, or ``None`` (the default: samples
        are independent).  The runner creates it once per dataset and passes it to every sample's session;
        ``finished`` are :meth:`sample_state` of the samples a resumed run already finished, in dataset order (they
        are fed back so the run continues as the uninterrupted one would)."""
        return None

    def new_state(self, total: int, num_layers: int, context_length: int, dataset: Any = None) -> AllocatorState:
        """Begin a sample: ``total`` tokens per stored head summed over ``num_layers`` layers; ``dataset`` is the
        dataset's state (:meth:`new_dataset_state`, ``None`` = a fresh one where the allocator needs one)."""
        return AllocatorState(total, num_layers, context_length, dataset=dataset)

    def start_sample(
        self, budget: Budget, num_layers: int, context_length: int, dataset: Any = None, *, extra_per_layer: int = 0
    ) -> AllocatorState:
        """Begin a sample under ``budget`` (what the eviction session calls): :meth:`new_state` with the budget's
        total over ``num_layers`` plus ``extra_per_layer`` tokens per layer (the window, when it is outside the
        budget).  An allocator that reads the budget itself overrides it (kvpress's PyramidKV reads ``S (1 - c)``
        before rounding: :class:`~kvbench.eviction.kvpress_pyramid.KvpressPyramidAllocator`)."""
        total = budget.total(context_length, num_layers) + num_layers * extra_per_layer
        return self.new_state(total, num_layers, context_length, dataset)

    @abstractmethod
    def on_layer(self, state: AllocatorState, observation: WindowObservation) -> dict[int, int]:
        """Budgets (tokens per head) to enforce now, for layer ``observation.layer_idx`` and possibly earlier
        layers whose budget changed (a cascading allocator may shrink them; they are re-compressed by score)."""

    def decode_budget(self, state: AllocatorState, layer_idx: int) -> int | None:
        """The size decode-time eviction keeps for a layer the prefill did not compress; ``None`` = its prefill
        budget (CAKE's code skips the prefill eviction below its trigger and still caps decoding at ``C``)."""
        return None

    def sample_state(self, state: AllocatorState) -> dict[str, Any] | None:
        """What this sample taught a stateful allocator (stored with the prediction; ``None`` = stateless)."""
        return None


class StaticLayerAllocator(LayerBudgetAllocator):
    """An allocator whose per-layer budgets depend only on (total, num_layers, context_length)."""

    @abstractmethod
    def plan(self, total: int, num_layers: int, context_length: int) -> list[int]:
        """Budget per layer; sums to ``total`` (up to the context-length cap applied by the caller)."""

    def new_state(self, total: int, num_layers: int, context_length: int, dataset: Any = None) -> AllocatorState:
        state = super().new_state(total, num_layers, context_length, dataset)
        state.budgets = self.plan(total, num_layers, context_length)
        return state

    def on_layer(self, state: AllocatorState, observation: WindowObservation) -> dict[int, int]:
        return {observation.layer_idx: state.budgets[observation.layer_idx]}


class UniformLayerAllocator(StaticLayerAllocator):
    """Every layer gets ``total // num_layers`` (the remainder goes to the first layers)."""

    def plan(self, total: int, num_layers: int, context_length: int) -> list[int]:
        base, extra = divmod(total, num_layers)
        return [base + (1 if layer < extra else 0) for layer in range(num_layers)]


class HeadBudgetAllocator(ReadOnlyAfterBuild, ABC):
    """Splits one layer's budget over its stored heads."""

    @abstractmethod
    def allocate(self, scores: torch.Tensor, budget_per_head: int) -> list[int]:
        """Per-head counts for ``[H, S]`` scores; they sum to ``budget_per_head * H`` and each is ``<= S``."""

    def allocate_for(self, scores: torch.Tensor, budget_per_head: int, model_dtype: torch.dtype) -> list[int]:
        """:meth:`allocate` for a model computing in ``model_dtype`` (what the eviction session calls): an allocator
        that counts in the model dtype as its reference code does overrides it; by default the dtype plays no part."""
        return self.allocate(scores, budget_per_head)


class UniformHeadAllocator(HeadBudgetAllocator):
    """Every head keeps the same number."""

    def allocate(self, scores: torch.Tensor, budget_per_head: int) -> list[int]:
        return [min(budget_per_head, scores.shape[1])] * scores.shape[0]


class ValueMerger(ReadOnlyAfterBuild, ABC):
    """Merge-on-evict: the values the kept tokens of a layer hold once the evicted ones are folded into them."""

    @abstractmethod
    def merged_values(self, layer: HeadwiseLayer, kept: list[torch.Tensor], scores: torch.Tensor) -> list[torch.Tensor]:
        """Per head ``[n_h, D]`` the values of the kept slots ``kept[h]`` (ascending) after merging, from the layer's
        stored keys and values before the eviction (the session stores them with ``rewrite_values`` once the layer
        keeps them); ``scores`` ``[H, S_max]`` are the slots' ranking scores (protected ``+inf``), for a reference
        that merges in its top-k order (its float sums round in that order)."""


class DecodePolicy(ReadOnlyAfterBuild, ABC):
    """Eviction while generating.  Called after each decoding step's attention at every layer, with the sample's
    :class:`DecodeState` (:meth:`new_state`)."""

    #: Whether the policy also reduces after a multi-token append (question-agnostic mode's question); what it
    #: scores the appended rows with is :meth:`append`'s business (default: the last appended query, as TOVA's
    #: reference, which reduces after every forward).
    evicts_on_append: bool = False
    #: How many of the last prompt queries the policy reads (:meth:`take_prompt_queries`; 0: none).
    prompt_window: int = 0
    #: Whether the policy reads each later forward's pre-RoPE queries (:meth:`take_prerope_queries`).
    reads_prerope_queries: bool = False
    #: Whether the policy stores the tokens it keeps in the order its selection returns them (``layer.keep(...,
    #: ordered=True)``) instead of slot order: kvpress's decoding presses, whose cache holds a compression's kept
    #: tokens in ``torch.topk`` order, so the model's attention sums over them in kvpress's order.  Positions are
    #: stored per token, so nothing else reads the order.
    keeps_selection_order: bool = False

    def new_state(self) -> DecodeState:
        """A sample's empty decode state (filled layer by layer by :meth:`start_layer`)."""
        return DecodeState()

    def take_prompt_queries(self, state: DecodeState, layer_idx: int, queries: torch.Tensor) -> None:
        """The layer's last :attr:`prompt_window` prompt queries ``[H_q, <=W, D]``, handed over by the session once
        the layer's prefill is compressed (before :meth:`start_layer`; R-KV's query cache).  Default: ignored."""

    def take_prerope_queries(self, state: DecodeState, layer_idx: int, queries: torch.Tensor) -> None:
        """The pre-RoPE queries ``[H_q, q, D]`` of a forward after the prefill (``q_proj`` of the layer's hidden
        states, model dtype), handed over before its attention when :attr:`reads_prerope_queries`.  Default:
        ignored."""

    def take_prefill_scores(self, state: DecodeState, layer_idx: int, scores: torch.Tensor) -> None:
        """The layer's prefill scores ``[H, S]`` (float32, every prompt token, the window's as the scorer returned
        them), handed over by the session once they are computed, before the layer is shrunk (kvpress's decoding
        presses order the cache by them).  Default: ignored."""

    def start_layer(
        self,
        state: DecodeState,
        layer_idx: int,
        layer: HeadwiseLayer,
        head_budgets: list[int],
        scores: list[torch.Tensor] | None = None,
    ) -> None:
        """The layer's prefill is done.

        ``head_budgets`` are the per-head caps to keep during decoding; ``scores`` (per head ``[S_h]``, aligned
        with the stored tokens) are the prefill indicator's scores of the kept tokens, when there are any.
        """
        state.caps[layer_idx] = torch.tensor(head_budgets, dtype=torch.int64)

    @abstractmethod
    def step(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        """One decoding step at ``layer`` (the new token is already stored); ``query`` is ``[H_q, 1, D]``.

        May call ``layer.keep(...)`` to evict.
        """

    def append(
        self, state: DecodeState, layer_idx: int, layer: HeadwiseLayer, query: torch.Tensor, scaling: float
    ) -> None:
        """A multi-token forward after the prefill (question-agnostic mode's question) at ``layer``: the ``q`` new
        tokens are already stored (the last ``q`` slots of every head); ``query`` is ``[H_q, q, D]``.

        Default: when :attr:`evicts_on_append`, one :meth:`step` with the last appended query; else nothing.
        """
        if self.evicts_on_append:
            self.step(state, layer_idx, layer, query[:, -1:], scaling)


# ---------------------------------------------------------------------------------------------------- method
@dataclass(frozen=True)
class EvictionMethod:
    """A complete eviction method: the pieces plus the knobs that govern how they are combined.

    A frozen recipe: building it freezes its pieces (:class:`ReadOnlyAfterBuild`), so one method object serves every
    sample of a run, batched or not; each sample's state lives in its session.  Variants are made with
    :func:`dataclasses.replace`.  ``scorer=None`` means no prefill eviction (``full``, or decode-only policies).
    """

    name: str
    family: str
    scorer: TokenScorer | None
    layer_allocator: LayerBudgetAllocator = field(default_factory=UniformLayerAllocator)
    head_allocator: HeadBudgetAllocator = field(default_factory=UniformHeadAllocator)
    decode_policy: DecodePolicy | None = None
    window: int = 32
    window_in_budget: bool = True
    keep_window: bool = True
    sink_tokens: int = 0
    gqa_granularity: str = "kv_head"
    gqa_agg: str = "mean"
    #: Also evict sliding-window layers (kvbench.cache.sliding; off: they hold their window and budgets go to full
    #: layers).
    compress_sliding: bool = False
    settings: dict[str, Any] = field(default_factory=dict)
    #: Session knobs (:class:`kvbench.eviction.knobs.SessionKnobs`) this recipe does not read: left out of the recorded
    #: settings, and an error when set (:func:`check_unused_knobs`).
    ignored_knobs: frozenset[str] = frozenset()
    #: After a layer's prefill eviction, the key channels each head keeps (ThinK; ``None``: every channel).
    key_channel_pruner: KeyChannelPruner | None = None
    #: At a prefill eviction, folds the evicted tokens' values into the kept ones (MergingPress; ``None``: evict).
    value_merger: ValueMerger | None = None

    def __post_init__(self) -> None:
        pieces = (self.scorer, self.layer_allocator, self.head_allocator, self.decode_policy, self.key_channel_pruner)
        pieces += (self.value_merger,)
        for piece in pieces:
            if isinstance(piece, ReadOnlyAfterBuild):
                piece.freeze()

    def __deepcopy__(self, memo: dict[int, Any]) -> EvictionMethod:
        """The recipe is immutable: a copy of something that holds it (a session) shares it."""
        return self

    @property
    def unshared_prefill(self) -> str | None:
        """Why this method runs its own prefill in a sweep (its scorer's ``unshared_prefill``), ``None`` when it shares
        one prefill forward per sample with the sweep's other jobs (issue #56; ``kvbench list methods`` shows it)."""
        return getattr(self.scorer, "unshared_prefill", None)

    @property
    def evicts(self) -> bool:
        """Whether the method removes anything at all."""
        return self.scorer is not None or self.decode_policy is not None


def _discover_methods() -> None:
    """Import kvbench's method modules (the installed packages' methods are imported one at a time, when asked for:
    :func:`_load_plugin_method`); an entry point named like one of them is reported once, never loaded."""
    submodule_importer("kvbench.methods")()
    from kvbench.eviction.plugins import report_clashes

    report_clashes(METHOD_FAMILIES.names())  # the built-ins discovered so far: this discovery is running


def _load_plugin_method(family: str) -> None:
    """Import the installed package declaring method ``family`` (entry-point group ``kvbench.methods``), if any:
    :func:`kvbench.eviction.plugins.load_plugin` (a broken one raises its ``PluginError``, for that method only)."""
    from kvbench.eviction.plugins import load_plugin

    load_plugin(family)


#: The one registry of methods: every method class by family name (``method.family``), filled by the class itself
#: when it is defined (:class:`kvbench.eviction.family.FamilyMethod`: ``class X(..., family="x")``); an installed
#: package's method is imported when it is asked for (:func:`_load_plugin_method`).
METHOD_FAMILIES: Registry[Any] = Registry("method family", discover=_discover_methods, load_missing=_load_plugin_method)


def load_plugin_methods() -> dict[str, str]:
    """Import every installed package's methods but those named like one of kvbench's own (``kvbench list
    methods``); the broken ones: family -> why."""
    from kvbench.eviction.plugins import load_plugins

    return load_plugins(METHOD_FAMILIES.names())


def method_families() -> list[str]:
    """All registered family names."""
    return METHOD_FAMILIES.names()


def build_method(method_cfg: Any) -> EvictionMethod:
    """Build the method described by ``method_cfg``: a :class:`kvbench.config.MethodConfig`, an OmegaConf node of
    one (the composed ``cfg.method``) or a mapping of its fields.  The family's class is made from ``method.params``
    (validated: an unknown knob, a wrong type or value is an error listing its knobs,
    :meth:`~kvbench.eviction.family.FamilyMethod.from_params`), then builds its recipe
    (:meth:`~kvbench.eviction.family.FamilyMethod.build`).  A session knob set where the built method does not read it
    is an error (:func:`check_unused_knobs`); so is ``decode_eviction`` for a method that has no decode-time policy
    (it would change nothing, yet be recorded as if it did)."""
    method_cfg = as_method_config(method_cfg)
    knobs = METHOD_FAMILIES.get(method_cfg.family).from_params(method_cfg.params)
    method = knobs.build(method_cfg)
    check_unused_knobs(knobs, method)
    if knobs.decode_eviction and method.decode_policy is None:
        raise ValueError(
            f"method.params.decode_eviction=True is not used by the {method_cfg.family} family: it has no decode-time "
            "policy, so nothing would be evicted while decoding. Remove the override (method.params.decode_eviction="
            "false), or pick a family that evicts while decoding (h2o, tova, streamingllm, cake, ahakv)"
        )
    return method


def as_method_config(method_cfg: Any) -> DictConfig:
    """``method_cfg`` as an OmegaConf node of :class:`kvbench.config.MethodConfig` (a node is returned as it is; a
    dataclass instance or a mapping is merged into the schema, so a misspelt key or a wrong type is refused; a session
    knob spelt as before issue #57, ``window`` beside ``params``, moves into ``params`` with a one-line note)."""
    if isinstance(method_cfg, DictConfig):
        return method_cfg
    if isinstance(method_cfg, Mapping):
        method_cfg = dict(method_cfg)
        for note in move_session_knobs(method_cfg):
            LOG.warning(note)
    try:
        return OmegaConf.merge(OmegaConf.structured(MethodConfig), OmegaConf.structured(method_cfg))
    except OmegaConfBaseException as err:
        valid = ", ".join(field.name for field in fields(MethodConfig))
        raise ValueError(f"method config {method_cfg!r}: {str(err).splitlines()[0]}; the keys are: {valid}") from None


def common_knobs(method_cfg: Any, knobs: Any) -> dict[str, Any]:
    """The :class:`EvictionMethod` keyword arguments every family's recipe shares: its name and family (from the
    composed ``method_cfg``) and the session knobs of ``knobs``, the method's class
    (:class:`~kvbench.eviction.knobs.SessionKnobs`)."""
    return {
        "name": method_cfg.name,
        "family": method_cfg.family,
        "window": int(knobs.window),
        "window_in_budget": bool(knobs.window_in_budget),
        "sink_tokens": int(knobs.sink_tokens),
        "gqa_granularity": str(knobs.gqa_granularity),
        "gqa_agg": str(knobs.gqa_agg),
    }


def score_options(knobs: Any, reference_gqa_reduce: str = "before_pool") -> ScoreOptions:
    """The scoring options of a method's class ``knobs``: its ``gqa_agg`` (a session knob) and the scorer knobs it
    declares (:class:`~kvbench.eviction.token_scores.VoteKnobs` or a part of it); a knob it does not declare is at
    :class:`VoteKnobs`'s default, ``gqa_reduce: null`` the family's reference order."""
    declared = {name: getattr(knobs, name, getattr(_VOTE_DEFAULTS, name)) for name in _VOTE_KNOBS}
    return ScoreOptions(
        kernel_size=int(declared["kernel_size"]),
        pooling=str(declared["pooling"]),
        gqa_agg=str(knobs.gqa_agg),
        gqa_reduce=str(declared["gqa_reduce"] or reference_gqa_reduce),
        pool_padding=str(declared["pool_padding"]),
        score_dtype=str(declared["score_dtype"]),
    )


_VOTE_DEFAULTS = VoteKnobs()
_VOTE_KNOBS = tuple(field.name for field in fields(VoteKnobs))
