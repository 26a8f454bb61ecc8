"""A method that is one class: its dataclass fields are its knobs, and the class registers itself (issue #41).

A scorer method subclasses :class:`ScorerMethod` with a family name and writes one ``score``::

    @dataclass(frozen=True)
    class KNorm(ScorerMethod, family="knorm"):
        def score(self, observation: WindowObservation) -> torch.Tensor:
            return -observation.keys.norm(dim=-1)  # [H, S]: keep the smallest key norms

That is the whole method.  Defining the class registers a builder for ``method.family == "knorm"``
(:func:`kvbench.methods.family.build_family_method`, the one generic builder of every method class, the paper families'
too: :class:`kvbench.methods.family.FamilyMethod`).  Saved as ``kvbench/methods/knorm.py`` (the module is named after
the family), ``method=knorm`` composes with no YAML: :func:`kvbench.overrides.prepare_overrides` finds the module
without importing it and registers a default preset (``name: knorm, family: knorm``, the schema's defaults) in
Hydra's ConfigStore; a ``conf/method/knorm.yaml``, where one exists, is the preset that wins (``kvbench
list methods`` says which).

* Knobs: the dataclass fields, set as ``method.params.<field>`` and validated by
  :func:`kvbench.methods.params.parse_params` (type, :func:`~kvbench.methods.params.choice`,
  :func:`~kvbench.methods.params.bounded`); an unknown one is an error listing the class's fields.
* Wrappers over any scorer, declared once in :mod:`kvbench.methods.wrappers` (SnapKV's presets have them too):
  ``allocation: ada`` (Ada-KV's head-wise allocation; ``ada_kvpress``
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

from kvbench.methods.base import EvictionMethod, TokenScorer, common_knobs
from kvbench.methods.family import FamilyMethod
from kvbench.methods.wrappers import HEAD_ALLOCATIONS, LAYER_SCHEDULES, RESCALES, Wrappers, apply_wrappers

__all__ = ["HEAD_ALLOCATIONS", "LAYER_SCHEDULES", "RESCALES", "SCORER_METHODS", "ScorerMethod"]

#: The one-class methods by family (registered by their class; their builders are in ``METHOD_FAMILIES`` too).
SCORER_METHODS: dict[str, type[ScorerMethod]] = {}


@dataclasses.dataclass(frozen=True)
class _Protection:
    #: Protect the last ``method.window`` prompt tokens (they rank before every other token); off by default.
    keep_window: bool = False


@dataclasses.dataclass(frozen=True)
class ScorerMethod(TokenScorer, FamilyMethod, Wrappers, _Protection):
    """Base of the one-class methods (module docstring): subclass with ``family=<name>`` and write ``score``.

    Its knobs: ``keep_window`` (protection), then the wrapper knobs of :class:`kvbench.methods.wrappers.Wrappers`."""

    #: The code the method reproduces (``repo path@version``), given as ``class X(..., reference="...")``; shown by
    #: ``kvbench list methods`` and recorded in the method's settings.
    reference: ClassVar[str] = ""

    def __init_subclass__(cls, family: str | None = None, reference: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(family=family, **kwargs)
        if family is not None:
            cls.reference = reference
            SCORER_METHODS[family] = cls

    def build(self, method_cfg: Any) -> EvictionMethod:
        """The scorer under the wrappers its fields turn on (:func:`~kvbench.methods.wrappers.apply_wrappers`), with
        the session knobs."""
        method = EvictionMethod(
            scorer=self,
            settings={**dataclasses.asdict(self), **({"reference": self.reference} if self.reference else {})},
            **{**common_knobs(method_cfg), "keep_window": self.keep_window},
        )
        return apply_wrappers(method, self)
