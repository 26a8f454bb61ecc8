"""CaM (kvpress's ``CAMPress``, issue #58) against NVIDIA/kvpress 0.5.5's recordings: the recorded tiny Llama
(float32 and bfloat16) prefills whole, takes a 4-token question in one forward and 10 single steps (teacher-forced),
compressing every 4 forwards to 40 tokens with merges over windows of 4; every layer and head ends with kvpress's
positions and kvpress's merged values (the Bernoulli draws from torch's global generator, seeded as recorded)."""

from __future__ import annotations

import torch

from kvbench.budget import parse_budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.inference.eviction import EvictionSession
from kvbench.inference.prefill import forward_logits
from kvbench.methods.cam import cam_merge
from tests.methods.test_kvpress_decoding import QUESTION, tiny_llama
from tests.methods.wrapper_replay import KeptTally
from tests.parity.kvpress_claims import Claim, claim_of
from tests.reference_recordings import RecordedCase, inputs_meta, load_recording, recorded_kept_values, stored_input


def run_seeded(case: RecordedCase, method) -> KVBenchCache:
    """The case's prompt (kept whole: ``budget=<S>/layer``, as kvpress's CAMPress), question and single steps, the
    global generator seeded as the recorder seeded it (after building the model, before the prefill)."""
    model = tiny_llama(case.dtype)
    ids = stored_input(f"{case.inputs}/input_ids")[0].tolist()
    decoded = stored_input(f"decode_ids/S{case.length}").flatten().tolist()
    cache = KVBenchCache(2)
    session = EvictionSession(method, parse_budget(f"{case.length}/layer"), cache)
    device = torch.device("cpu")
    torch.manual_seed(inputs_meta()["seeds"]["global"])
    with torch.no_grad():
        session.begin_prefill(len(ids))
        forward_logits(model, ids, 0, cache, session, device)
        session.begin_append()
        forward_logits(model, decoded[:QUESTION], len(ids), cache, session, device)
        session.begin_decode()
        for step, token in enumerate(decoded[QUESTION:]):
            forward_logits(model, [token], len(ids) + QUESTION + step, cache, session, device)
    return cache


def replay_cam(claim: Claim, form: str, dtype: str) -> KeptTally:
    """Every case of the claim's recording (``CAMPress_KnormPress``) in ``dtype``, the prompt kept whole
    (``budget=<S>/layer``, ``form``: only ``per_layer``): per layer and head of the final cache ``same`` = kvpress's
    positions and merged values bit for bit, else different."""
    assert form == "per_layer", form
    values_of = recorded_kept_values(claim.recording)
    tally = KeptTally()
    for index, case in enumerate(load_recording(claim.recording).cases):
        if case.dtype != dtype:
            continue
        tally.cases += 1
        settings = case.settings
        params = {key: settings[key] for key in ("compression_interval", "target_size", "merge_budget")}
        method = claim.build(**params)
        cache = run_seeded(case, method)
        for layer, stored in enumerate(cache.headwise_layers):
            for head, reference in enumerate(case.kept[layer]):
                order = torch.tensor(reference).argsort()
                same = stored.positions[head].tolist() == sorted(reference)
                same = same and torch.equal(stored.head_kv(head)[1].float(), values_of[index][layer][head][order])
                tally.same, tally.differ = tally.same + same, tally.differ + (not same)
    return tally


def test_cam_keeps_kvpress_tokens_and_merged_values() -> None:
    tallies = [replay_cam(claim_of("CAMPress_KnormPress"), "per_layer", dtype) for dtype in ("float32", "bfloat16")]
    assert all(t.differ == 0 for t in tallies), tallies
    assert sum(t.same for t in tallies) == len(load_recording("CAMPress_KnormPress").cases) * 4


def test_cam_merge_spreads_a_drawn_candidate_over_its_window() -> None:
    """A candidate whose attention is at least its window's mean always merges (probability 1): ``v / |window|`` is
    added to each of the kept tokens after it; one with no kept token after it merges nowhere."""
    values = torch.zeros(1, 6, 2)
    values[0, 1] = torch.tensor([4.0, 8.0])
    values[0, 5] = torch.tensor([1.0, 1.0])
    attention = torch.tensor([[1.0, 5.0, 1.0, 1.0, 1.0, 9.0]])
    kept = torch.tensor([0, 2, 3, 4])
    merged = cam_merge(values, attention, kept, torch.tensor([1, 5]), merge_budget=2)
    assert merged[0, 2].tolist() == [2.0, 4.0] and merged[0, 3].tolist() == [2.0, 4.0]
    assert merged[0, 4].tolist() == [0.0, 0.0] and merged[0, 0].tolist() == [0.0, 0.0]
