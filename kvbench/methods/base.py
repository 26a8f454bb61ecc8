"""The method interface: an eviction method is four small pieces that work on plain tensors.

* :class:`TokenScorer` -- the *indicator*: importance of every context token for one layer, from the observation
  window's queries against the keys (``[H, S]``, higher = keep).
* :class:`LayerBudgetAllocator` -- how the total budget is split over layers (uniform, pyramid, preference...).
  It is called layer by layer during prefill and may revise earlier layers' budgets (cascading, CAKE-style).
* :class:`HeadBudgetAllocator` -- how a layer's budget is split over its stored heads (uniform, Ada-KV top-B...).
* :class:`DecodePolicy` -- what happens to the cache while generating (nothing, StreamingLLM window, H2O, TOVA).

:class:`EvictionMethod` bundles them with the method knobs from ``conf/method/<name>.yaml``; a family registers
a builder with :func:`register_method` (one file per family under ``kvbench/methods/``).  None of the pieces needs
a model: tests drive them with hand-built tensors.  A built method is a frozen recipe: what a sample accumulates
(allocator state, decode caps, running scores) is created by the pieces (``new_state``) and owned by the sample's
session, what spans a dataset by ``LayerBudgetAllocator.new_dataset_state`` (:mod:`kvbench.methods.state`).

Shapes use ``H_q`` query heads, ``H`` stored heads (KV heads, or query heads with ``gqa_granularity=query_head``),
``W`` window queries, ``S`` context tokens, ``D`` head dim.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kvbench import kernels
from kvbench.budget import Budget
from kvbench.checks import check_min
from kvbench.config import MethodConfig, check_method_choices
from kvbench.methods.channels import KeyChannelPruner
from kvbench.methods.knobs import check_unused_knobs
from kvbench.methods.prerope import PreRopeStates
from kvbench.methods.state import AllocatorState, DecodeState, ReadOnlyAfterBuild
from kvbench.methods.token_scores import ScoreOptions, VoteKnobs
from kvbench.registry import Registry, submodule_importer

if TYPE_CHECKING:  # type hints only: importing the cache would import transformers
    from kvbench.cache.kv_cache import HeadwiseLayer


# ---------------------------------------------------------------------------------------------------- observation
@dataclass
class WindowObservation:
    """Everything a scorer or allocator may look at for one layer at the end of a compressed prefill.

    The attention statistics come from the fused kernels (:mod:`kvbench.kernels`): :meth:`window_stats` and
    :meth:`column_sums` never build the ``[H_q, W, S]`` or ``[H_q, S, S]`` matrix (the dense reference is
    ``kvbench.kernels.reference``, used by the tests and by ``impl="dense"``).

    Attributes
    ----------
    layer_idx, num_layers:
        Which layer, out of how many.
    queries:
        ``[H_q, W, D]`` post-RoPE queries of the last ``W`` prompt tokens (the observation window).
    keys, values:
        ``[H, S, D]`` the layer's stored keys (post-RoPE) and values; the window's own keys are ``keys[:, S-W:]``.
    scaling:
        Softmax scale of the model's attention (usually ``D ** -0.5``).
    prompt_queries:
        ``[H_q, R, D]`` post-RoPE queries of the last ``R`` prompt tokens: every one (``R = S``) unless the scorer
        asked for fewer (``None`` unless it asked for them with :meth:`TokenScorer.prompt_rows`).
    prompt_column_sums:
        ``[H_q, S]`` float32 attention each key received from every prompt row (accumulated by the session over
        the prefill chunks when the scorer asked for it), or ``None`` (then :meth:`column_sums` computes it from
        ``prompt_queries``).
    layer_budget:
        The budget (tokens per head) the allocator has just set for this layer, when known before scoring
        (AhaKV's step-gain softmax derives its temperature from it); ``None`` otherwise.
    impl:
        Kernel implementation of the statistics: ``auto`` (Triton on CUDA, chunked torch on CPU), ``triton``,
        ``torch``, or ``dense`` (the materialising reference; for comparisons).
    sample_key:
        A stable number identifying the sample: a hash of the compressed prompt's token ids (0 when unknown).
        Methods that draw random numbers (NACL) seed from it, so a sample's draws do not depend on which samples
        ran before it (resumed runs, subsets, reordering).
    rotary:
        The model's rotary position embedding, when it has one: ``rotary(positions [N], dtype) -> (cos, sin)``, each
        ``[N, D]`` in ``dtype``, as the model's own rotary module computes them (scorers that need pre-RoPE states
        or future positions' rotations: Expected Attention); ``None`` when unknown.
    output_projection:
        ``[hidden, H_q D]`` the layer's attention output projection weight (``o_proj.weight``), when the model has
        one (CriticalKV's value norms); ``None`` when unknown.
    prerope:
        The layer's pre-RoPE keys and queries recomputed from its input hidden states (kvpress's way), when the
        scorer asked for them (:attr:`PromptRows.prerope_keys`) and the session could keep those; ``None``
        otherwise (then :func:`kvbench.methods.prerope.prerope_states` un-rotates the stored states).
    """

    layer_idx: int
    num_layers: int
    queries: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    scaling: float
    prompt_queries: torch.Tensor | None = None
    prompt_column_sums: torch.Tensor | None = None
    layer_budget: int | None = None
    impl: str = "auto"
    _stats: dict[Any, kernels.WindowStats] = field(default_factory=dict, repr=False, compare=False)
    sample_key: int = 0
    rotary: Callable[[torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]] | None = None
    output_projection: torch.Tensor | None = None
    prerope: PreRopeStates | None = None

    @property
    def window(self) -> int:
        return int(self.queries.shape[1])

    @property
    def context_length(self) -> int:
        return int(self.keys.shape[1])

    @property
    def num_heads(self) -> int:
        """Stored heads ``H``."""
        return int(self.keys.shape[0])

    @property
    def model_dtype(self) -> torch.dtype:
        """The dtype the model computes in (the references cast their float32 softmax back to it)."""
        return self.queries.dtype

    def window_stats(self, prob_dtype: torch.dtype | None = None) -> kernels.WindowStats:
        """Statistics of the window's float32 softmax attention over all keys (causal in the window); computed once
        per ``prob_dtype`` (scorer and allocator share them).  See :class:`kvbench.kernels.WindowStats`.

        ``prob_dtype`` (the model dtype under ``score_dtype=model``) rounds as the reference code does: the logits
        of its ``matmul(q, k^T) / sqrt(d)`` in that dtype, then each probability of its float32 softmax cast back.
        """
        if prob_dtype not in self._stats:
            self._stats[prob_dtype] = kernels.window_stats(
                self.queries, self.keys, self.scaling, prob_dtype=prob_dtype, logit_dtype=prob_dtype, impl=self.impl
            )
        return self._stats[prob_dtype]

    def use_window_stats(self, stats: kernels.WindowStats, prob_dtype: torch.dtype | None = None) -> None:
        """Give the observation the window statistics :meth:`window_stats` returns for ``prob_dtype``, instead of
        computing them from ``queries`` and ``keys`` (statistics of a given attention, e.g. a hand-made ``[H_q, W,
        S]`` probability tensor through :func:`kvbench.kernels.reference.stats_of_probs`)."""
        self._stats[prob_dtype] = stats

    def last_query_attention(self, prob_dtype: torch.dtype | None = None) -> torch.Tensor:
        """``[H_q, S]`` float32 attention of the last prompt query over all keys (TOVA's prefill score), logits and
        probabilities rounded to ``prob_dtype`` when given (as :meth:`window_stats`)."""
        last = self.queries[:, -1:]
        return kernels.window_stats(
            last, self.keys, self.scaling, prob_dtype=prob_dtype, logit_dtype=prob_dtype, impl=self.impl
        ).col_sum

    def column_sums(self, prob_dtype: torch.dtype | None = None) -> torch.Tensor:
        """``[H_q, S]`` float32 attention each key receives from every prompt row (H2O's all-rows score), logits
        and probabilities rounded to ``prob_dtype`` first when given (as :meth:`window_stats`).

        The session's accumulated sums when it has them (it rounds as :meth:`TokenScorer.prompt_rows` asked),
        else computed from ``prompt_queries``.
        """
        if self.prompt_column_sums is not None:
            return self.prompt_column_sums
        queries = self.prompt_queries
        if queries is None or queries.shape[1] != self.context_length:
            raise ValueError(
                "all-rows scores need the column sums or the queries of every prompt row; the scorer must ask for "
                "them with TokenScorer.prompt_rows"
            )
        return kernels.causal_column_sums(
            queries, self.keys, self.scaling, prob_dtype=prob_dtype, logit_dtype=prob_dtype, impl=self.impl
        )


@dataclass(frozen=True)
class PromptRows:
    """What an indicator reads from the prompt rows *before* the observation window.

    The session keeps it across the chunks of a chunked prefill (``run.prefill_chunk``), so the indicator sees what
    a one-shot prefill gives it.

    Attributes
    ----------
    column_sums:
        The attention each key receives from every prompt row (:attr:`WindowObservation.prompt_column_sums`),
        accumulated chunk by chunk: ``O(H_q x S)`` floats per layer.
    prob_dtype:
        Rounding of the logits and of each probability in those sums (``None`` = float32).
    queries:
        The prompt queries (:attr:`WindowObservation.prompt_queries`), kept across chunks: every one, ``O(H_q x S x
        D)`` per layer (AhaKV's ``ra: false`` ablation, whose per-row temperature needs the layer budget), or only
        the last ``query_rows(S)`` of a prompt of ``S`` tokens (NACL's proxy rows).
    query_rows:
        ``S -> R``: how many of the last prompt queries to keep (``None`` = all ``S``).
    prerope_keys, prerope_queries:
        The pre-RoPE keys / queries of every prompt row (:attr:`WindowObservation.prerope`,
        :mod:`kvbench.methods.prerope`).  On a model path the session keeps the layer's input hidden states (``O(S
        x hidden)`` per layer across the chunks of a chunked prefill; nothing extra in one forward) and they are
        recomputed from them; without hidden states they are un-rotated from the stored keys and, for queries, from
        every prompt query, which the session then keeps as if ``queries`` were asked.
    """

    column_sums: bool = False
    prob_dtype: torch.dtype | None = None
    queries: bool = False
    query_rows: Callable[[int], int] | None = None
    prerope_keys: bool = False
    prerope_queries: bool = False

    @property
    def prerope(self) -> bool:
        """Whether the scorer reads pre-RoPE states (so the session keeps the layer's hidden states)."""
        return self.prerope_keys or self.prerope_queries


# ---------------------------------------------------------------------------------------------------- pieces
class TokenScorer(ReadOnlyAfterBuild, ABC):
    """Importance of each context token at one layer."""

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """What :meth:`score` reads from the prompt rows before the window (default: nothing)."""
        return PromptRows()

    @abstractmethod
    def score(self, observation: WindowObservation) -> torch.Tensor:
        """Return ``[H, S]`` scores, one row per stored head (query heads where the method stores per query head,
        KV heads otherwise), higher = keep; ``[H_q, S]`` is accepted and reduced per GQA group by ``method.gqa_agg``.
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
        before rounding: :class:`~kvbench.methods.kvpress_pyramid.KvpressPyramidAllocator`)."""
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


class DecodePolicy(ReadOnlyAfterBuild, ABC):
    """Eviction while generating.  Called after each decoding step's attention at every layer, with the sample's
    :class:`DecodeState` (:meth:`new_state`)."""

    #: Whether the policy also reduces after a multi-token append (question-agnostic mode's question); what it
    #: scores the appended rows with is :meth:`append`'s business (default: the last appended query, as TOVA's
    #: reference, which reduces after every forward).
    evicts_on_append: bool = False
    #: How many of the last prompt queries the policy reads (:meth:`take_prompt_queries`; 0: none).
    prompt_window: int = 0

    def new_state(self) -> DecodeState:
        """A sample's empty decode state (filled layer by layer by :meth:`start_layer`)."""
        return DecodeState()

    def take_prompt_queries(self, state: DecodeState, layer_idx: int, queries: torch.Tensor) -> None:
        """The layer's last :attr:`prompt_window` prompt queries ``[H_q, <=W, D]``, handed over by the session once
        the layer's prefill is compressed (before :meth:`start_layer`; R-KV's query cache).  Default: ignored."""

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
    #: Session knobs (``MethodConfig`` fields, :data:`kvbench.methods.knobs.RECORDED_KNOBS`) this method never reads:
    #: left out of the recorded settings, and an error when set (:func:`check_unused_knobs`).
    ignored_knobs: frozenset[str] = frozenset()
    #: After a layer's prefill eviction, the key channels each head keeps (ThinK; ``None``: every channel).
    key_channel_pruner: KeyChannelPruner | None = None

    def __post_init__(self) -> None:
        pieces = (self.scorer, self.layer_allocator, self.head_allocator, self.decode_policy, self.key_channel_pruner)
        for piece in pieces:
            if isinstance(piece, ReadOnlyAfterBuild):
                piece.freeze()

    def __deepcopy__(self, memo: dict[int, Any]) -> EvictionMethod:
        """The recipe is immutable: a copy of something that holds it (a session) shares it."""
        return self

    @property
    def evicts(self) -> bool:
        """Whether the method removes anything at all."""
        return self.scorer is not None or self.decode_policy is not None


MethodBuilder = Callable[[Any], EvictionMethod]


def _discover_methods() -> None:
    """Import kvbench's method modules, then the installed packages' methods (:mod:`kvbench.methods.plugins`)."""
    submodule_importer("kvbench.methods")()
    from kvbench.methods.plugins import load_plugins

    load_plugins()


#: Method builders by ``method.family``.
METHOD_FAMILIES: Registry[MethodBuilder] = Registry("method family", discover=_discover_methods)


def register_method(family: str) -> Callable[[MethodBuilder], MethodBuilder]:
    """Register a builder ``builder(method_cfg) -> EvictionMethod`` for ``method.family == family``."""
    return METHOD_FAMILIES.register(family)


def method_families() -> list[str]:
    """All registered family names."""
    return METHOD_FAMILIES.names()


def build_method(method_cfg: Any) -> EvictionMethod:
    """Build the method described by ``method_cfg``: a :class:`kvbench.config.MethodConfig`, an OmegaConf node of
    one (the composed ``cfg.method``) or a mapping of its fields.  A knob the family does not declare is an error
    listing its knobs (``method.params``: :func:`kvbench.methods.params.parse_params`; a session knob it does not
    read: :func:`check_unused_knobs`); so is ``decode_eviction`` for a method that has no decode-time policy (it
    would change nothing, yet be recorded as if it did)."""
    method_cfg = as_method_config(method_cfg)
    builder = METHOD_FAMILIES.get(method_cfg.family)
    check_method_choices(method_cfg)
    check_min("method.window", method_cfg.window, 1)
    method = builder(method_cfg)
    check_unused_knobs(method_cfg, method)
    if method_cfg.decode_eviction and method.decode_policy is None:
        raise ValueError(
            f"method.decode_eviction=True is not used by the {method_cfg.family} family: it has no decode-time "
            "policy, so nothing would be evicted while decoding. Remove the override (method.decode_eviction=false), "
            "or pick a family that evicts while decoding (h2o, tova, streamingllm, cake, ahakv)"
        )
    return method


def as_method_config(method_cfg: Any) -> DictConfig:
    """``method_cfg`` as an OmegaConf node of :class:`kvbench.config.MethodConfig` (a node is returned as it is; a
    dataclass instance or a mapping is merged into the schema, so a misspelt key or a wrong type is refused)."""
    if isinstance(method_cfg, DictConfig):
        return method_cfg
    try:
        return OmegaConf.merge(OmegaConf.structured(MethodConfig), OmegaConf.structured(method_cfg))
    except OmegaConfBaseException as err:
        valid = ", ".join(field.name for field in fields(MethodConfig))
        raise ValueError(f"method config {method_cfg!r}: {str(err).splitlines()[0]}; the keys are: {valid}") from None


def common_knobs(method_cfg: Any) -> dict[str, Any]:
    """The MethodConfig knobs shared by every family, as EvictionMethod keyword arguments."""
    return {
        "name": method_cfg.name,
        "family": method_cfg.family,
        "window": int(method_cfg.window),
        "window_in_budget": bool(method_cfg.window_in_budget),
        "sink_tokens": int(method_cfg.sink_tokens),
        "gqa_granularity": str(method_cfg.gqa_granularity),
        "gqa_agg": str(method_cfg.gqa_agg),
    }


def score_options(method_cfg: Any, knobs: Any = None, reference_gqa_reduce: str = "before_pool") -> ScoreOptions:
    """The scoring options of a family: ``method.gqa_agg`` (a session knob) and the scorer knobs the family declares
    in its params dataclass ``knobs`` (:class:`~kvbench.methods.token_scores.VoteKnobs` or a part of it); a knob it
    does not declare is at :class:`VoteKnobs`'s default, ``gqa_reduce: null`` the family's reference order."""
    declared = {name: getattr(knobs, name, getattr(_VOTE_DEFAULTS, name)) for name in _VOTE_KNOBS}
    return ScoreOptions(
        kernel_size=int(declared["kernel_size"]),
        pooling=str(declared["pooling"]),
        gqa_agg=str(method_cfg.gqa_agg),
        gqa_reduce=str(declared["gqa_reduce"] or reference_gqa_reduce),
        pool_padding=str(declared["pool_padding"]),
        score_dtype=str(declared["score_dtype"]),
    )


_VOTE_DEFAULTS = VoteKnobs()
_VOTE_KNOBS = tuple(field.name for field in fields(VoteKnobs))
