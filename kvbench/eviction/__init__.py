"""The machinery every eviction method builds on (issue #57): the pieces and the recipe (``base``), a method's class
and its knobs (``family``, ``recipe``, ``knobs``, ``params``), what a score reads (``observation``, ``token_scores``,
``prerope``), the wrappers over any scorer and their pieces (``wrappers``, ``head_allocation``, ``layer_schedules``,
``selection``, ``critical``, ``kvpress_*``), the sample state and the plug-in loader.  The methods themselves are
``kvbench/methods/``, one file per family.

A method author's API, importable from here (each name loaded from its module on first use)::

    from kvbench.eviction import ScorerMethod, WindowObservation, bounded, choice
"""

from __future__ import annotations

import importlib
from typing import Any

#: The names a method author needs -> their module under ``kvbench.eviction``.
API = {
    "ScorerMethod": "recipe",
    "FamilyMethod": "family",
    "EvictionMethod": "base",
    "TokenScorer": "base",
    "LayerBudgetAllocator": "base",
    "StaticLayerAllocator": "base",
    "HeadBudgetAllocator": "base",
    "DecodePolicy": "base",
    "build_method": "base",
    "common_knobs": "base",
    "score_options": "base",
    "METHOD_FAMILIES": "base",
    "WindowObservation": "observation",
    "PromptRows": "observation",
    "SessionKnobs": "knobs",
    "Wrappers": "wrappers",
    "apply_wrappers": "wrappers",
    "choice": "params",
    "bounded": "params",
    "VoteKnobs": "token_scores",
    "PoolingKnobs": "token_scores",
    "ScoreDtypeKnob": "token_scores",
    "ScoreOptions": "token_scores",
    "aggregate_groups": "token_scores",
    "pool_scores": "token_scores",
    "window_votes": "token_scores",
    "with_window_columns": "token_scores",
}
__all__ = sorted(API)


def __getattr__(name: str) -> Any:
    if name in API:
        value = getattr(importlib.import_module(f"{__name__}.{API[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *API})
