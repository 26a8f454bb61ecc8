"""Expected Attention against NVIDIA/kvpress's ``ExpectedAttentionPress`` (0.5.5, defaults, on the tiny Llama's
recorded prefill).  The pre-RoPE queries come from the layer's recorded hidden states through its ``q_proj`` (what a
model path gives): scores bit for bit and kvpress's kept tokens in float32 and bfloat16.  The fallback without
hidden states (the post-RoPE queries un-rotated) scores float32 to rounding and bfloat16 to 1e-3."""

from __future__ import annotations

import torch

from kvbench.eviction.base import build_method
from kvbench.methods.expected_attention import average_rotation, rotate_half, unrotate
from tests.methods.kvpress_replay import hidden_states_observation, replay, rotary_observation
from tests.reference_recordings import load_recording


def test_expected_attention_scores_and_selections_match_kvpress_exactly() -> None:
    """From hidden states, float32 and bfloat16: scores equal to kvpress's, kept tokens per head the same or, where
    kvpress's bfloat16 scores tie at the cut, another valid top-k (measured: 55 same, 9 at an exact tie of 64)."""
    method = build_method({"name": "expected_attention", "family": "expected_attention"})
    tally = replay(method, "ExpectedAttentionPress", hidden_states_observation, score_atol=0.0)
    assert tally.cases == 16 and tally.same + tally.tied_valid == tally.selections == 64
    assert tally.max_score_error == 0.0


def test_unrotated_fallback_keeps_kvpress_tokens() -> None:
    """Without hidden states: float32 scores within 1e-6 of kvpress's, bfloat16 within 1e-3 (un-rotated queries round
    differently from ``q_proj``'s); kept tokens per head the same or a valid top-k at a tie."""
    method = build_method({"name": "expected_attention", "family": "expected_attention"})
    tally = replay(method, "ExpectedAttentionPress", rotary_observation, score_atol=1e-6, dtypes=("float32",))
    assert tally.cases == 8 and tally.same + tally.tied_valid == tally.selections == 32
    tally = replay(method, "ExpectedAttentionPress", rotary_observation, score_atol=1e-3, dtypes=("bfloat16",))
    assert tally.cases == 8 and tally.same + tally.tied_valid == tally.selections == 32


def test_unrotate_inverts_the_rotation_and_the_average_rotation_is_its_mean() -> None:
    """``unrotate`` undoes ``x cos + rotate_half(x) sin``; the averaged matrix applied to a vector is the mean of
    the rotated vectors."""
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(2, 5, 8, generator=generator)
    angles = torch.rand(5, 4, generator=generator) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rotated = states * cos + rotate_half(states) * sin
    torch.testing.assert_close(unrotate(rotated, cos, sin), states)
    vector = states[0, 0]
    expected = (vector * cos + rotate_half(vector) * sin).mean(0)
    torch.testing.assert_close(vector @ average_rotation(cos, sin).T, expected)
    assert load_recording("ExpectedAttentionPress").cases[0].settings["n_future_positions"] == 512


def test_dataset_statistics_mode_scores_as_kvpress_when_given_the_prompts_own_statistics(tmp_path) -> None:
    """``stats: <file>`` (kvpress's ``ExpectedAttentionStatsPress``): fed the statistics kvpress computed from each
    float32 prompt (pre-RoPE ``q_proj`` queries after the sinks, biased covariance), it scores as the recording."""
    from safetensors.torch import save_file

    from tests.reference_recordings import case_inputs, tiny_llama_weights

    weights = tiny_llama_weights(torch.float32)
    checked = 0
    for case in load_recording("ExpectedAttentionPress").cases:
        if case.dtype != "float32" or case.compression_ratio != 0.5:
            continue
        means, covariances, observations = [], [], []
        for layer, inputs in enumerate(case_inputs(case)):
            hidden = inputs["hidden_states"][0, 4:]
            queries = (hidden @ weights[f"model.layers.{layer}.self_attn.q_proj.weight"].T).view(-1, 4, 16)
            queries = queries.transpose(0, 1)  # [H_q, S - 4, D]
            centred = queries - queries.mean(1, keepdim=True)
            means.append(queries.mean(1))
            covariances.append(torch.einsum("hsi,hsj->hij", centred, centred) / queries.shape[1])
            observations.append(rotary_observation(case, layer, inputs))
        path = tmp_path / f"stats_{case.length}.safetensors"
        save_file({"query_mean": torch.stack(means), "query_cov": torch.stack(covariances)}, str(path))
        method = build_method({"name": "ea", "family": "expected_attention", "params": {"stats": str(path)}})
        assert not method.scorer.prompt_rows(torch.float32).queries
        for layer, observation in enumerate(observations):
            observation.prompt_queries = None  # the statistics replace the prompt's queries
            scores = method.scorer.score(observation)
            torch.testing.assert_close(scores, case.layer_scores(layer), atol=1e-6, rtol=0)
            checked += 1
    assert checked == 4  # S = 48 and 128, two layers each
