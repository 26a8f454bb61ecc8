"""SimLayerKV (kvbench/methods/simlayerkv.py) against kvpress 0.5.5's ``SimLayerKVPress`` as recorded on the tiny
Llama, float32 and bfloat16: the lazy score of every layer, the lazy decision and the kept tokens."""

from __future__ import annotations

from kvbench.methods.simlayerkv import lazy_score
from tests.methods.heads_replay import kept_by_kvbench, model_layers, recording
from tests.methods.helpers import method_from_yaml


def test_lazy_layers_and_kept_tokens_match_kvpress() -> None:
    cases = recording("SimLayerKV")["cases"]
    assert len(cases) == 48
    lazy, selections = 0, 0
    recorded_lazy = sum(len(heads[0]) < int(c["inputs"].rsplit("S", 1)[1]) for c in cases for heads in c["kept"])
    assert 0 < recorded_lazy < len(cases) * 2  # both decisions occur
    for case in cases:
        settings = {key: case[key] for key in ("lazy_threshold", "n_last", "n_initial", "n_recent")}
        method = method_from_yaml("simlayerkv", params=settings)
        for layer, inputs in enumerate(model_layers(case["inputs"], case["dtype"])):
            queries = inputs["queries"][:, -32:]
            where = (case["inputs"], case["dtype"], settings, layer)
            score = lazy_score(queries[:, -case["n_last"] :], inputs["keys"], case["n_initial"], case["n_recent"])
            # The same float32 / bfloat16 steps; float32: the recomputed queries' matmul may round the last bit.
            assert abs(score - case["lazy_scores"][layer]) <= (1e-6 if case["dtype"] == "float32" else 0), (
                *where,
                score,
            )
            kept = kept_by_kvbench(method, layer, 2, queries, inputs["keys"], inputs["values"], 64)
            assert kept == [sorted(h) for h in case["kept"][layer]], where
            lazy += len(kept[0]) < inputs["keys"].shape[1]
            selections += len(kept)
    assert lazy == recorded_lazy and selections == 48 * 2 * 2


def test_budget_sets_what_a_lazy_layer_keeps() -> None:
    """n_recent null: a lazy layer keeps exactly the budget (4 sinks + the most recent budget - 4)."""
    inputs = model_layers("model/sdpa/float32/S48", "float32")[0]
    method = method_from_yaml("simlayerkv", params={"lazy_threshold": 0.2})
    kept = kept_by_kvbench(method, 0, 2, inputs["queries"][:, -32:], inputs["keys"], inputs["values"], 20)
    assert kept == [[0, 1, 2, 3, *range(32, 48)]] * 2
    strict = method_from_yaml("simlayerkv", params={"lazy_threshold": 0.99})
    assert (
        kept_by_kvbench(strict, 0, 2, inputs["queries"][:, -32:], inputs["keys"], inputs["values"], 20)
        == [list(range(48))] * 2
    )
