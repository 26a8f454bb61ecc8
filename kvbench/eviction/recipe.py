"""A method that is one class: a frozen dataclass of its knobs plus its score, registered by defining it (#41, #57).

A scorer method subclasses :class:`ScorerMethod` with a family name and writes one ``score``::

    @dataclass(frozen=True)
    class KNorm(ScorerMethod, family="knorm"):
        def score(self, observation: WindowObservation) -> torch.Tensor:
            return -observation.keys.norm(dim=-1)  # [H, S]: keep the smallest key norms

That is the whole method.  Defining the class registers it for ``method.family == "knorm"`` in the one
registry of methods (:data:`kvbench.eviction.base.METHOD_FAMILIES`, the paper families' too:
:class:`kvbench.eviction.family.FamilyMethod`); :func:`scorer_recipe` composes it with the wrappers.  Saved as
``kvbench/methods/knorm.py`` (the module is named after the family), ``method=knorm`` composes with no YAML:
:func:`kvbench.app.overrides.prepare_overrides` finds the module without importing it and registers a default preset
(``name: knorm, family: knorm``, the class's knobs at their defaults) in Hydra's ConfigStore (so does a class defined
in your own script or notebook, before you compose); a ``conf/method/knorm.yaml``, where one exists, is the preset
that wins (``kvbench list methods`` says which).

* Knobs: the dataclass fields, the session knobs among them (``window``, ``gqa_agg``, ``sink_tokens`` ...:
  :class:`kvbench.eviction.knobs.SessionKnobs`), all set as ``method.params.<field>`` and validated by
  :func:`kvbench.eviction.params.parse_params` (type, :func:`~kvbench.eviction.params.choice`,
  :func:`~kvbench.eviction.params.bounded`); an unknown one is an error listing the class's fields.
* Wrappers over any scorer, declared once in :mod:`kvbench.eviction.wrappers` (SnapKV's presets have them too):
  ``allocation: ada`` (Ada-KV's head-wise allocation; ``ada_kvpress``
  kvpress's reading of it), ``layers: pyramid`` (PyramidKV's layer schedule), ``selection: chunkkv | chunk | block``
  (kvpress's ChunkKV, Chunk and Block presses, :mod:`kvbench.eviction.selection`, sized by ``selection_length``) and
  ``rescale: critical`` (CriticalKV, :mod:`kvbench.eviction.critical`); ``method=knorm method.params.allocation=ada``
  runs KNorm under Ada-KV's allocation, and its default preset's name (the results folder) names the wrappers that
  are on (``knorm+ada``, ``knorm+chunkkv``, ``knorm+ada_kvpress+critical``).
* Protection: :attr:`ScorerMethod.keep_window` is a declared field (off: every token competes on its score, as
  kvpress's presses); ``window`` sizes the protected window when on, ``sink_tokens`` protects the first tokens.
* Score shape: ``[H, S]``, one row per stored head (KV heads, or query heads with ``gqa_granularity=query_head``);
  ``[H_q, S]`` is accepted and reduced per GQA group by ``gqa_agg``.
* The object is frozen: a recipe, shared by every sample; what a sample accumulates belongs to its session.
* A knob the class does not declare is an error listing its fields (``method.params.kernel_size`` on KNorm);
  ``decode_eviction=true`` is refused (no decode-time policy: ``decode_interval`` is the wrapper's).
* Reuse: a subclass extends a method's score (``class VATP(SnapKV)`` multiplies SnapKV's by the values' L1 norm:
  docs/methods/add-a-method.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from kvbench.config import SESSION_KNOBS
from kvbench.eviction.base import EvictionMethod, TokenScorer, common_knobs
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.wrappers import HEAD_ALLOCATIONS, LAYER_SCHEDULES, RESCALES, Wrappers, apply_wrappers

__all__ = ["HEAD_ALLOCATIONS", "LAYER_SCHEDULES", "RESCALES", "ScorerMethod", "scorer_recipe"]


@dataclasses.dataclass(frozen=True)
class ScorerMethod(TokenScorer, Wrappers, FamilyMethod):
    """Base of the one-class methods (module docstring): subclass with ``family=<name>`` and write ``score``.

    Its knobs: the session knobs (:class:`kvbench.eviction.knobs.SessionKnobs`), the wrapper knobs of
    :class:`kvbench.eviction.wrappers.Wrappers`, then ``keep_window``.  The recipe is built by :func:`scorer_recipe`
    (the class is the scorer; the builder composes it with the wrappers and the session knobs)."""

    #: Protect the last ``window`` prompt tokens (they rank before every other token); off by default (kvpress's
    #: presses let every token compete on its score).
    keep_window: bool = False

    #: The code the method reproduces (``repo path@version``), given as ``class X(..., reference="...")``; shown by
    #: ``kvbench list methods`` and recorded in the method's settings.
    reference: ClassVar[str] = ""

    def __init_subclass__(cls, family: str | None = None, reference: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(family=family, **kwargs)
        if family is not None:
            cls.reference = reference

    def recipe_settings(self) -> dict[str, Any]:
        """What the run records as the method's resolved settings (``metrics.json``): its knobs but the session ones
        (recorded beside them), and its reference."""
        knobs = {key: value for key, value in dataclasses.asdict(self).items() if key not in SESSION_KNOBS}
        return {**knobs, **({"reference": self.reference} if self.reference else {})}

    def build(self, method_cfg: Any) -> EvictionMethod:
        """:func:`scorer_recipe`."""
        return scorer_recipe(self, method_cfg)


def scorer_recipe(method: ScorerMethod, method_cfg: Any) -> EvictionMethod:
    """The recipe of a one-class method: ``method`` is the scorer, under the wrappers its fields turn on
    (:func:`~kvbench.eviction.wrappers.apply_wrappers`), with its session knobs and ``keep_window``."""
    recipe = EvictionMethod(
        scorer=method,
        settings=method.recipe_settings(),
        **{**common_knobs(method_cfg, method), "keep_window": method.keep_window},
    )
    return apply_wrappers(recipe, method)
