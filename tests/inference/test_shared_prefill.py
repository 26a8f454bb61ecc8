"""A shared prefill (issue #56, :mod:`kvbench.inference.shared_prefill`): one forward fanned out to many jobs gives
each job what its prefill alone gives -- the same tokens and the same cache record (kept tokens, per-head counts,
stored and allocated bytes) -- for every method preset, CPU float32, aware and agnostic, in one forward or chunks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import kvbench.attention  # noqa: F401  (registers the "kvbench" attention)
from kvbench.bench.random_models import load_method
from kvbench.budget import parse_budget
from kvbench.config import MethodConfig
from kvbench.eviction.base import METHOD_FAMILIES, build_method
from kvbench.eviction.threshold import is_threshold_method
from kvbench.inference.generate import decode_prefilled, generate
from kvbench.inference.shared_prefill import PrefillJob, cache_layout, check_shareable, shared_prefill
from kvbench.models.loading import load_model

REPO = Path(__file__).resolve().parents[2]
PRESETS = {path.stem for path in (REPO / "conf" / "method").glob("*.yaml")}


def _method(name: str):
    """The preset ``name`` (conf/method), else the family ``name`` at its defaults (a one-class method)."""
    if name in PRESETS:
        return load_method(name)
    return build_method(OmegaConf.merge(OmegaConf.structured(MethodConfig), {"name": name, "family": name}))


@pytest.fixture(scope="module")
def tiny():
    """The embedded default's trained tiny model (GQA, float32, CPU) and its tokenizer."""
    cfg = {"name": "tiny", "path": str(REPO / "models" / "tiny-niah"), "dtype": "float32", "device": "cpu",
           "max_input_length": 8192, "chat_template": False}  # fmt: skip
    loaded = load_model(OmegaConf.create(cfg))
    return loaded.model, loaded.tokenizer


def _prompt(seed: int) -> tuple[list[int], list[int]]:
    ids = torch.randint(5, 250, (150,), generator=torch.Generator().manual_seed(seed)).tolist()
    return ids[:-10], ids[-10:]


def _compare(model, tokenizer, jobs: list[tuple[str, str]], mode: str, chunk: int | None, seed: int) -> None:
    """Each job's tokens and cache record from one shared prefill (per cache layout) equal its generation alone."""
    context, question = _prompt(seed)
    methods = {job: _method(job[0]) for job in jobs}
    # A threshold method (DMS) takes a threshold, not a size: KNorm-style scores are minus key norms.
    jobs = [(name, "-3.0thr" if is_threshold_method(methods[(name, budget)]) else budget) for name, budget in jobs]
    methods = {job: _method(job[0]) for job in jobs}
    by_layout: dict[tuple[str, bool], list[tuple[str, str]]] = {}
    for job in jobs:
        by_layout.setdefault(cache_layout(methods[job]), []).append(job)
    for group in by_layout.values():
        torch.manual_seed(0)  # each job starts from this random state, shared or alone (leverage scores draw)
        prefill_jobs = [PrefillJob(methods[job], parse_budget(job[1])) for job in group]
        states = shared_prefill(model, context, question, prefill_jobs, question_mode=mode, prefill_chunk=chunk,
                                tokenizer=tokenizer)  # fmt: skip
        shared = [decode_prefilled(model, tokenizer, state, 4, set()) for state in states]
        for job, got in zip(group, shared, strict=True):
            torch.manual_seed(0)
            alone = generate(model, tokenizer, context, question, method=_method(job[0]),
                             budget=parse_budget(job[1]), question_mode=mode, max_new_tokens=4, stop_token_ids=set(),
                             prefill_chunk=chunk)  # fmt: skip
            assert got.token_ids == alone.token_ids, job
            assert got.record.to_json() == alone.record.to_json(), f"{job}: cache record"


def test_every_family_shares_a_prefill_and_equals_its_run_alone(tiny) -> None:
    """Every registered method family (its preset of that name, else its defaults) but those that prefill alone
    (``unshared_prefill``: kvcompose's eager attention), one shared forward per cache layout, two budgets for a few."""
    model, tokenizer = tiny
    families = [family for family in sorted(METHOD_FAMILIES) if _method(family).unshared_prefill is None]
    assert set(METHOD_FAMILIES) - set(families) == {"kvcompose"}
    jobs = [(family, "16L") for family in families] + [("snapkv", "48L"), ("cake", "48L")]
    _compare(model, tokenizer, jobs, "aware", None, seed=1)


@pytest.mark.parametrize(("mode", "chunk"), [("agnostic", None), ("aware", 40), ("agnostic", 33)])
def test_shared_prefill_equals_alone_with_the_question_appended_or_chunks(tiny, mode: str, chunk: int | None) -> None:
    """Question appended on each compressed cache; chunked prefill (H2O's column sums against the driver's keys,
    pre-RoPE hidden states over chunks, KVzip's replay, Finch's re-rotation)."""
    model, tokenizer = tiny
    names = ["snapkv", "h2o", "tova", "cake", "expected_attention_kvpress", "compactor_kvpress", "kvzip", "finch"]
    names.append("restorekv")  # the restore pass after KVzip's replay, the question fed from S + n
    _compare(model, tokenizer, [(name, "24L") for name in names], mode, chunk, seed=2)


def test_jobs_of_other_cache_layouts_or_unshared_methods_are_refused() -> None:
    snapkv, tova = load_method("snapkv"), load_method("tova")  # tova stores query heads, snapkv KV heads
    budget = parse_budget("16L")
    with pytest.raises(ValueError, match="different cache layouts"):
        check_shareable([PrefillJob(snapkv, budget), PrefillJob(tova, budget)])
    with pytest.raises(ValueError, match="at least one job"):
        check_shareable([])


def test_a_method_that_cannot_share_says_so_in_one_attribute() -> None:
    """``TokenScorer.unshared_prefill``: the method runs its own prefill in a sweep (its reason recorded), a shared
    prefill refuses it, and ``kvbench list methods`` names it."""
    from kvbench.app.listing import _sharing_note
    from kvbench.eviction.base import EvictionMethod, TokenScorer
    from kvbench.run.prefill_groups import unshared_reason

    class Peeking(TokenScorer):
        unshared_prefill = "changes the prefill's attention"

        def score(self, observation):
            return observation.keys.norm(dim=-1)

    method = EvictionMethod(name="peeking", family="peeking", scorer=Peeking())
    assert method.unshared_prefill == "changes the prefill's attention"
    assert load_method("snapkv").unshared_prefill is None
    with pytest.raises(ValueError, match="cannot share a prefill: changes the prefill's attention"):
        check_shareable([PrefillJob(method, parse_budget("16L"))])
    cfg = OmegaConf.create({"method": {"name": "peeking"}, "run": {"share_prefill": True, "decode_batch": 1}})
    assert unshared_reason(cfg, method) == "method peeking: changes the prefill's attention"
    assert "peeking (changes the prefill's attention)" in _sharing_note({"peeking": Peeking})
