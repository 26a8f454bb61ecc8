"""Every method preset runs end to end on the embedded default model with every budget in conf/budget/: the YAML
presets and the default preset of every method defined by a class alone (read from the method registry, so a new
one-class method is covered with no edit here).

The suite runs a fixed sample of the method x budget product, so that it does not grow with every method x every
budget: the baselines' main presets (the preset named after its family: snapkv, pyramidkv, h2o, tova, streamingllm,
nacl) run every budget (they set the reference paths of the eviction session), the paper methods' main presets
(ada_snapkv, ada_pyramidkv, cake, ahakv, xkv) the ``<n>L`` budgets (64L ... 2048L), their variants (ablations and
paper versions: a knob of the same machinery) the :data:`PAPER_VARIANT_BUDGETS` (far below, just under and above the
1K context), and every other method -- the full cache, the baselines' variants, one-class scorers, plug-ins,
kvpress-variant presets, whose budgets take the session's paths the baselines already cover -- the
:data:`SAMPLED_BUDGETS`: no eviction, a per-layer total, a per-head count and a ratio; a threshold method (DMS) a
threshold (:data:`THRESHOLD_BUDGETS`), issue #58's kvpress presses one budget
(:data:`WRAPPER_BUDGETS`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from kvbench.app.overrides import prepare_overrides
from kvbench.app.validation import validate_run
from kvbench.config import register_configs
from kvbench.eviction.base import METHOD_FAMILIES, method_families
from kvbench.run.runner import Runner
from kvbench.views.run_views import read_run_extras

CONF = Path(__file__).resolve().parents[2] / "conf"
YAML_METHODS = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))
method_families()  # imports every method module: the one-class methods register themselves
METHODS = sorted({*YAML_METHODS, *METHOD_FAMILIES.names()})
BUDGETS = sorted(p.stem for p in (CONF / "budget").glob("*.yaml"))
PAPER_FAMILIES = {"ada_snapkv", "ada_pyramidkv", "cake", "ahakv", "xkv"}
#: Ratio presets added for AhaKV's Figure 4 that take no path the other ratios do not (ratio0.04, a budget below the
#: observation window, stays in).
SAME_PATH_BUDGETS = {"ratio0.6", "ratio0.4"}


#: Families whose main preset (named after the family) runs every budget (module docstring).
BASELINE_FAMILIES = {"streamingllm", "h2o", "tova", "snapkv", "pyramidkv", "nacl"}
#: The budgets every other method runs: one per budget path of the eviction session.
SAMPLED_BUDGETS = ["full", "64L", "128perlayer", "ratio0.5"]
#: The budgets a paper method's variant runs (its main preset runs every ``<n>L`` budget): far below the 1K context,
#: just under it, above it.
PAPER_VARIANT_BUDGETS = ["64L", "1000L", "2048L"]
#: Threshold methods (DMS) take a threshold budget, nothing else (kvbench/budget.py): one threshold.
THRESHOLD_FAMILIES = {"dms"}
THRESHOLD_BUDGETS = ["thr-3.0"]
#: kvpress's presses of issue #58 (wrappers over a scorer, CAP-KV): they take the session's paths the baselines cover,
#: so one budget (the issue's ``budget=64L`` run); their parity tests cover the rest.
WRAPPER_FAMILIES = {"merging", "composed", "per_layer", "cam", "entropy_chunkkv", "lukv", "cap", "kvcompose"}
WRAPPER_BUDGETS = ["64L"]


def budgets_for(method: str) -> list[str]:
    """Every budget for the baselines' main presets; the total-per-layer (``<n>L``) ones for the paper methods' main
    presets, :data:`PAPER_VARIANT_BUDGETS` for their variants; :data:`SAMPLED_BUDGETS` for any other method (module
    docstring)."""
    family = OmegaConf.load(CONF / "method" / f"{method}.yaml").family if method in YAML_METHODS else method
    if family in THRESHOLD_FAMILIES:
        return THRESHOLD_BUDGETS
    if family in WRAPPER_FAMILIES:
        return WRAPPER_BUDGETS
    if family in PAPER_FAMILIES:
        return [b for b in BUDGETS if re.fullmatch(r"\d+L", b)] if method == family else PAPER_VARIANT_BUDGETS
    if family in BASELINE_FAMILIES and method == family:
        return [b for b in BUDGETS if b not in SAME_PATH_BUDGETS]
    return SAMPLED_BUDGETS


@pytest.mark.parametrize("method", METHODS)
def test_method_runs_with_every_budget(tmp_path: Path, method: str) -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for budget in budgets_for(method):
            cfg = compose(
                "config",
                overrides=prepare_overrides(
                    [
                        f"method={method}",
                        f"budget={budget}",
                        "task.lengths=[1024]",
                        "task.num_samples=1",
                        "task.datasets=[niah_single_1k]",
                        f"run.output_root={tmp_path}",
                        "run.progress=false",
                        "run.print_table=false",
                    ]
                ),
            )
            results = Runner(validate_run(cfg)).run()
            assert len(results) == 1
            name = cfg.method.name
            metrics_path = tmp_path / cfg.model.name / "tiny_niah" / name / budget / "niah_single_1k" / "metrics.json"
            metrics = json.loads(metrics_path.read_text())
            cache = metrics["cache"]
            assert cache["allocation_exact"], (method, budget, cache)
            # Ada-KV's reference rounds each head on its own; DuoAttention's retrieval heads, SimLayerKV's non-lazy
            # layers keep everything and HeadKV's head budgets move tokens between layers (their budget semantics).
            if cfg.method.family not in ("ada_snapkv", "ada_pyramidkv", "duo_attention", "headkv", "simlayerkv"):
                assert cache["budget_exact"], (method, budget, cache)
            if budget == "full" or method == "full":
                assert cache["samples_evicted"] == 0
            if budget in THRESHOLD_BUDGETS:  # a threshold's size is measured, and the views place the run by it
                assert 0 < cache["mean_kept_fraction"] < 1 and cache["mean_stored_bytes"] > 0, cache
                extras = read_run_extras(metrics_path.parent.parent, ["niah_single_1k"])
                measured = cache["mean_achieved_per_layer"]
                assert extras["budget_tokens_per_layer"] == pytest.approx(sum(measured) / len(measured)), extras
