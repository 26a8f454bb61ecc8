"""KVgrad against NVIDIA/kvpress 0.5.5's ``KVgradPress`` (recorded by ``scripts/reference/record_kvgrad.py``): the
recorded tiny Llama (float32 and bfloat16) prefills seeded prompts through kvbench's prefill, which replays the
context through kvbench's forward, cache and attention with a backward pass per chunk (outside the inference mode
generation runs under); every layer and head keeps kvpress's positions, or another valid top-k of kvpress's scores
where they tie."""

from __future__ import annotations

import torch

from kvbench.methods.base import build_method
from kvbench.methods.kvzip import chat_template_parts
from tests.methods.reference_models import Tally, exact_total, recording, tiny_llama, tokenizer, valid_topk


def kvgrad(**params):
    return build_method({"name": "kvgrad", "family": "kvgrad", "params": params})


def test_kvgrad_scores_and_keeps_kvpress_tokens_on_the_recorded_tiny_llama(monkeypatch) -> None:
    """Scores (past the sinks) bit for bit, selections the same or tied, float32 and bfloat16."""
    from kvbench.inference.prefill import prefill
    from kvbench.methods.kvgrad import KVgrad

    seen: list[torch.Tensor] = []
    select = KVgrad.select

    def recording_select(self, scores, *args, **kwargs):
        seen.append(torch.stack(scores).float().clone())
        return select(self, scores, *args, **kwargs)

    monkeypatch.setattr(KVgrad, "select", recording_select)

    data = recording("kvzip/KVgradPress")
    tally, models = Tally(), {}
    worst = 0.0
    for case in data["cases"]:
        model = models.setdefault(case["dtype"], tiny_llama(case["dtype"], data["model_config"]))
        heads = data["model_config"]["num_key_value_heads"]
        kept_total = sum(len(head) for layer in case["kept"] for head in layer)
        with torch.inference_mode():  # as generation runs: the backward leaves it
            state = prefill(
                model, case["input_ids"], method=kvgrad(**case["settings"]), budget=exact_total(kept_total // heads),
                tokenizer=tokenizer(case["tokenizer"]),
            )  # fmt: skip
        scores = torch.tensor(case["scores"])  # [L, H, S]
        sinks = case["settings"]["n_sink"]
        worst = max(worst, float((seen[-1][..., sinks:] - scores[..., sinks:]).abs().max()))
        ours = torch.zeros(scores.shape, dtype=torch.bool)
        for layer, cache_layer in enumerate(state.cache.headwise_layers):
            for head, positions in enumerate(cache_layer.positions):
                ours[layer, head, positions.long()] = True
        theirs = torch.zeros_like(ours)
        for layer, per_head in enumerate(case["kept"]):
            for head, positions in enumerate(per_head):
                theirs[layer, head, positions] = True
        tally.cases += 1
        layerwise = case["settings"]["layerwise"]
        scope = list(zip(scores.unbind(0), ours.unbind(0), strict=True)) if layerwise else [(scores, ours)]
        for layer in range(scores.shape[0]):
            for head in range(scores.shape[1]):
                if torch.equal(ours[layer, head], theirs[layer, head]):
                    tally.same += 1
                elif int(ours.sum()) == int(theirs.sum()) and all(valid_topk(s, m) for s, m in scope):
                    tally.tied += 1
                else:
                    tally.differ += 1
        length, chunk = len(case["input_ids"]), case["settings"]["chunk_size"]
        prefix, _ = chat_template_parts(tokenizer(case["tokenizer"]))
        assert state.session.record.extra_forwards == -(-(length - prefix) // chunk)
        assert state.position == length
    print("kvgrad parity:", tally.summary(), "max |score error|", worst)
    assert tally.cases == 12 and tally.differ == 0 and worst == 0.0, (tally.summary(), worst)
    assert tally.same >= 40, tally.summary()
