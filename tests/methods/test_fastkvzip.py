"""Fast KVzip against NVIDIA/kvpress 0.5.5's ``FastKVzipPress`` with the same gates: kvbench's shipped CPU-trained
gates for the embedded tiny model, built into kvpress's own ``FastKVzipGate`` modules by
``scripts/reference/record_learned.py`` (``tests/fixtures/reference/learned/FastKVzipPress_tiny-niah.json``; the
bfloat16 cases with the gates cast to bfloat16, as kvpress needs).  Scores bit for bit; every layer and head keeps
kvpress's positions or another valid top-k of kvpress's scores where they tie (the sinks and the window all score 1)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch

from kvbench.budget import parse_budget
from kvbench.errors import KVBenchError
from kvbench.eviction.base import build_method
from tests.methods.reference_models import selected_scores, tally_global_selection
from tests.methods.test_kvzap import LEARNED, REPO, tiny_niah
from tests.methods.wrapper_replay import KeptTally
from tests.parity.kvpress_claims import Claim, claim_of


def fastkvzip(**params):
    return build_method({"name": "fastkvzip", "family": "fastkvzip", "params": params})


def gate_file(case: dict, folder: Path) -> str:
    """The recorded gate file, or (bfloat16 cases) the same gates cast to bfloat16 as the recorder fed kvpress."""
    shipped = REPO / case["checkpoint"]
    if case["dtype"] == "float32":
        return str(shipped)
    target = folder / "q2_dim16_sink16.bf16.pt"
    if not target.exists():
        states = torch.load(shipped, weights_only=True)["module"]
        torch.save({"module": [{k: v.to(torch.bfloat16) for k, v in s.items()} for s in states]}, target)
    return str(target)


def replay_fastkvzip(claim: Claim, form: str, dtype: str) -> KeptTally:
    """Every case of the claim's recording (``learned/FastKVzipPress_tiny-niah``) in ``dtype`` at ``budget=<c>cr``
    (``form``: only ``cr``), the recorded gates (bfloat16: cast as the recorder fed kvpress): kvpress's total kept and
    its scores bit for bit (asserted); per layer and head kvpress's positions, another valid top-k of its scores, or
    different."""
    from kvbench.inference.prefill import prefill
    from kvbench.methods.fastkvzip import FastKVzip

    assert form == "cr", form
    data = json.loads((LEARNED / f"{claim.recording.removeprefix('learned/')}.json").read_text())
    assert data["versions"]["kvpress"] == "0.5.5"
    tally = KeptTally()
    with tempfile.TemporaryDirectory() as folder:
        for case in data["cases"]:
            if case["dtype"] != dtype:
                continue
            model, _ = tiny_niah(case["dtype"])
            settings = case["settings"]
            params = {key: settings[key] for key in ("n_sink", "layerwise", "window_size", "window_ratio")}
            method = claim.build(checkpoint=gate_file(case, Path(folder)), **params)
            with torch.inference_mode(), selected_scores(FastKVzip) as seen:
                budget = parse_budget(f"{case['compression_ratio']}cr")
                state = prefill(model, case["input_ids"], method=method, budget=budget)
            kept_total = sum(len(head) for layer in case["kept"] for head in layer)
            assert sum(len(p) for layer in state.cache.headwise_layers for p in layer.positions) == kept_total
            assert torch.equal(seen[-1], torch.tensor(case["scores"])), case["input_ids"][:8]
            tally_global_selection(tally, state.cache.headwise_layers, case, params["layerwise"])
            record = state.session.record
            assert record.extra_forwards == 0 and record.evicted and record.learned_weights["source"] == "file"
    return tally


def test_fastkvzip_scores_and_keeps_kvpress_tokens_with_the_same_gates() -> None:
    claim = claim_of("learned/FastKVzipPress_tiny-niah")
    tallies = [replay_fastkvzip(claim, "cr", dtype) for dtype in ("float32", "bfloat16")]
    print("fastkvzip parity:", tallies)
    assert sum(t.cases for t in tallies) == 16 and all(t.cases for t in tallies)
    assert all(t.differ == 0 for t in tallies), tallies
    assert sum(t.same for t in tallies) >= 80, tallies  # 16 cases x 3 layers x 2 heads = 96 selections


def test_batched_decoding_and_the_lm_eval_bridge() -> None:
    """``run.decode_batch`` gives batch 1's tokens and records (the shipped gates); ``kvbench.lmeval`` compresses a
    context under inference mode with them."""
    from kvbench.lmeval.loglikelihood import compress_context
    from tests.inference.test_batch_decode import _requests, assert_batched_equals_alone

    model, tokenizer = tiny_niah("float32")
    method, budget = fastkvzip(), parse_budget("0.5cr")
    requests = _requests(model.config.vocab_size, 3, stops={7})
    for expected in assert_batched_equals_alone(model, tokenizer, method, budget, requests, "aware", 3):
        assert expected.record.evicted and expected.record.learned_weights["source"] == "shipped"
    context = compress_context(model, list(range(4, 120)), method=method, budget=parse_budget("16L"),
                               question_mode="agnostic", tokenizer=None)  # fmt: skip
    assert context.record.evicted and context.record.extra_forwards == 0


def test_gate_files_are_checked_and_a_missing_one_names_how_to_get_it(tmp_path: Path) -> None:
    from kvbench.eviction.surrogates import load_gates, resolve_gates

    states = torch.load(REPO / "models/fastkvzip/tiny-niah/q2_dim16_sink16.pt", weights_only=True)["module"]
    broken = [dict(states[0], b=torch.zeros(2, 1, 3))]
    torch.save({"module": broken}, tmp_path / "broken.pt")
    with pytest.raises(ValueError, match=r"layer 0 b \(2, 1, 3\), not \(2, 1, 2\)"):
        load_gates.__wrapped__(str(tmp_path / "broken.pt"))
    with pytest.raises(KVBenchError, match=r"train_fastkvzip\.py"):
        resolve_gates.__wrapped__("auto", "some-org/Unknown-7B", "q4_dim16_sink16.pt")
    with pytest.raises(ValueError, match="allocation"):
        fastkvzip(allocation="ada")
