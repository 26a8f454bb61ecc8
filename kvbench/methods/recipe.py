"""A method that is one class: its dataclass fields are its knobs, and the class registers itself (issue #41).

A scorer method subclasses :class:`ScorerMethod` with a family name and writes one ``score``::

    @dataclass(frozen=True)
    class KNorm(ScorerMethod, family="knorm"):
        def score(self, observation: WindowObservation) -> torch.Tensor:
            return -observation.keys.norm(dim=-1)  # [H, S]: keep the smallest key norms

That is the whole method.  Defining the class registers a builder for ``method.family == "knorm"``
(:func:`kvbench.methods.family.build_family_method`, the one generic builder of every method class, the paper families'
too: :class:`kvbench.methods.family.FamilyMethod`).  Saved as ``kvbench/methods/knorm.py`` (the module is named after
the family), ``method=knorm`` composes with no YAML: :func:`kvbench.config.prepare_overrides` finds the module
without importing it and registers a default preset (``name: knorm, family: knorm``, the schema's defaults) in
Hydra's ConfigStore; a ``conf/method/knorm.yaml``, where one exists, is the preset that wins (``kvbench
list methods`` says which).

* Knobs: the dataclass fields, set as ``method.params.<field>`` and validated by
  :func:`kvbench.methods.params.parse_params` (type, :func:`~kvbench.methods.params.choice`,
  :func:`~kvbench.methods.params.bounded`); an unknown one is an error listing the class's fields.
* Wrappers over any scorer, declared once here: ``allocation: ada`` (Ada-KV's head-wise allocation; ``ada_kvpress``
  kvpress's reading of it), ``layers: pyramid`` (PyramidKV's layer schedule), ``selection: chunkkv | chunk | block``
  (kvpress's ChunkKV, Chunk and Block presses, :mod:`kvbench.methods.selection`, sized by ``selection_length``) and
  ``rescale: critical`` (CriticalKV, :mod:`kvbench.methods.critical`); ``method=knorm method.params.allocation=ada``
  runs KNorm under Ada-KV's allocation, and its default preset's name (the results folder) names the wrappers that
  are on (``knorm+ada``, ``knorm+chunkkv``, ``knorm+ada_kvpress+critical``).
* Protection: :attr:`ScorerMethod.keep_window` is a declared field (off: every token competes on its score, as
  kvpress's presses); ``method.window`` sizes the protected window when on, ``method.sink_tokens`` protects the
  first tokens.
* Score shape: ``[H, S]``, one row per stored head (KV heads, or query heads with ``gqa_granularity=query_head``);
  ``[H_q, S]`` is accepted and reduced per GQA group by ``method.gqa_agg``.
* The object is frozen: a recipe, shared by every sample; what a sample accumulates belongs to its session.
* A knob the class does not declare is an error listing its fields (``method.params.kernel_size`` on KNorm), as is
  ``method.decode_eviction`` (no decode-time policy: ``decode_interval`` is the wrapper's).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from kvbench.methods.adakv import PAPER_ALPHA, AdaHeadAllocator
from kvbench.methods.base import EvictionMethod, TokenScorer, common_knobs
from kvbench.methods.critical import wrap_critical
from kvbench.methods.family import FamilyMethod
from kvbench.methods.kvpress_ada import KvpressAdaAllocator
from kvbench.methods.kvpress_decoding import IntervalDecodingPolicy
from kvbench.methods.params import bounded, choice
from kvbench.methods.selection import SELECTIONS, wrap_selection
from kvbench.methods.snapkv import PyramidLayerAllocator

#: The head-allocation wrappers (``method.params.allocation``) and the layer schedules (``method.params.layers``).
HEAD_ALLOCATIONS = ("uniform", "ada", "ada_kvpress")
LAYER_SCHEDULES = ("uniform", "pyramid")
#: The score rescalings (``method.params.rescale``): none, or CriticalKV's.
RESCALES = ("none", "critical")

#: The one-class methods by family (registered by their class; their builders are in ``METHOD_FAMILIES`` too).
SCORER_METHODS: dict[str, type[ScorerMethod]] = {}


@dataclasses.dataclass(frozen=True)
class ScorerMethod(TokenScorer, FamilyMethod):
    """Base of the one-class methods (module docstring): subclass with ``family=<name>`` and write ``score``."""

    #: Protect the last ``method.window`` prompt tokens (they rank before every other token); off by default.
    keep_window: bool = False
    #: Wrapper: how a layer's budget is split over its heads: ``uniform`` or ``ada`` (Ada-KV's head-wise allocation,
    #: its reference code's settings: safeguard alpha 0.2, floor reading) or ``ada_kvpress`` (kvpress's
    #: ``AdaKVPress(press)``: safeguard then one top-k over the layer, :mod:`kvbench.methods.kvpress_ada`).
    allocation: str = choice("uniform", HEAD_ALLOCATIONS)
    #: Wrapper: how the total budget is split over layers: ``uniform`` or ``pyramid`` (PyramidKV's schedule, beta 20,
    #: KVCache-Factory's variant, the window ``method.window``).
    layers: str = choice("uniform", LAYER_SCHEDULES)
    #: Wrapper: which tokens a head keeps given the scores: ``topk`` (each head its top-k), or kvpress's ``chunkkv``
    #: (ChunkKVPress: whole chunks, the same on every head), ``chunk`` (ChunkPress: each chunk its own top-k) or
    #: ``block`` (BlockPress: block-wise scoring); :mod:`kvbench.methods.selection`.
    selection: str = choice("topk", SELECTIONS)
    #: The chunk or block length of ``selection`` (0: kvpress's default, chunkkv 20, chunk 1024, block 128).
    selection_length: int = bounded(0, 0)
    #: Wrapper: ``critical`` is CriticalKV (kvpress's ``CriticalKVPress``: the scores rescaled by the values'
    #: projected L1 norms, two stages); with ``allocation: ada_kvpress``, CriticalAdaKV
    #: (:mod:`kvbench.methods.critical`).
    rescale: str = choice("none", RESCALES)
    #: Wrapper: kvpress's ``DecodingPress``: every ``decode_interval`` forwards after the prefill, each head is cut back
    #: to its budget by the scores of the whole cache (0: off; :mod:`kvbench.methods.kvpress_decoding`).
    decode_interval: int = bounded(0, 0)
    #: The size ``decode_interval`` cuts each head back to (kvpress's ``target_size``; 0: the head's budget).
    decode_target: int = bounded(0, 0)
    #: kvpress's ``CompressionRatioDecodingPress``: ``decode_interval`` cuts to ``max(1, int(seen (1 - r)))`` of the
    #: tokens seen so far (0: off; ``r`` in ``[0, 1)``, exclusive with ``decode_target``).
    decode_ratio: float = bounded(0.0, 0.0, 1.0)

    #: The code the method reproduces (``repo path@version``), given as ``class X(..., reference="...")``; shown by
    #: ``kvbench list methods`` and recorded in the method's settings.
    reference: ClassVar[str] = ""

    def __init_subclass__(cls, family: str | None = None, reference: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(family=family, **kwargs)
        if family is not None:
            cls.reference = reference
            SCORER_METHODS[family] = cls

    def build(self, method_cfg: Any) -> EvictionMethod:
        """The scorer under the wrappers its fields turn on, with the session knobs."""
        knobs = common_knobs(method_cfg)
        wrappers: dict[str, Any] = {}
        if self.allocation == "ada":
            wrappers["head_allocator"] = AdaHeadAllocator(PAPER_ALPHA["late"], "floor")
        elif self.allocation == "ada_kvpress":
            wrappers["head_allocator"] = KvpressAdaAllocator()
        if self.layers == "pyramid":
            wrappers["layer_allocator"] = PyramidLayerAllocator(20, knobs["window"])
        if self.selection != "topk" and self.allocation != "uniform":
            raise ValueError(
                f"method.params.selection={self.selection!r} sets its own per-head counts: it does not combine with "
                f"method.params.allocation={self.allocation!r}; valid with it: allocation=uniform"
            )
        method = EvictionMethod(
            scorer=self,
            **wrappers,
            settings={**dataclasses.asdict(self), **({"reference": self.reference} if self.reference else {})},
            **{**knobs, "keep_window": self.keep_window},
        )
        if self.decode_interval:
            policy = IntervalDecodingPolicy(
                self, self.decode_interval, knobs["gqa_agg"], knobs["window"], self.decode_target, self.decode_ratio
            )
            method = dataclasses.replace(method, decode_policy=policy)
        if self.rescale == "critical":
            if self.selection != "topk" or self.allocation == "ada":
                raise ValueError(
                    "method.params.rescale=critical combines with method.params.allocation=uniform (CriticalKV) or "
                    f"ada_kvpress (CriticalAdaKV) and selection=topk; got allocation={self.allocation!r}, "
                    f"selection={self.selection!r}"
                )
            return wrap_critical(method, adaptive=self.allocation == "ada_kvpress")
        return wrap_selection(method, self.selection, self.selection_length)
