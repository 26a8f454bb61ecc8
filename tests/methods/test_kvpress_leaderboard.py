"""kvpress's leaderboard protocol (issue #43): kvpress's budget as ``<c>cr``, ``+experiment=kvpress_leaderboard`` run
dry on a small model, and its table (``make tables``) with our runs beside kvpress's published cells."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from kvbench.app.overrides import prepare_overrides
from kvbench.app.validation import validate_run
from kvbench.budget import BudgetError, parse_budget
from kvbench.config import budget_choice, register_configs
from kvbench.eviction.kvpress_pyramid import kvpress_pyramid_budgets
from kvbench.reporting.aggregate import load_runs
from kvbench.reporting.paper_refs import TABLES, load_reference
from kvbench.reporting.render import render_markdown
from kvbench.reporting.tables import compare_table
from kvbench.run.runner import Runner
from tests.reference_recordings import kvpress_n_kept
from tests.reporting.test_tables import write_full_run

CONF = Path(__file__).resolve().parents[2] / "conf"
RULER13 = [f"niah_single_{i}" for i in (1, 2, 3)] + [f"niah_multikey_{i}" for i in (1, 2, 3)]
RULER13 += ["niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"]


def test_cr_budget_keeps_kvpress_n_kept() -> None:
    """``<c>cr`` keeps kvpress's ``max(1, int(S (1 - c)))`` per layer for every length, and names its preset."""
    for ratio in ("0", "0.25", "0.3", "0.5", "0.75", "0.875", "0.99"):
        budget = parse_budget(f"{ratio}cr")
        for length in range(1, 600):
            assert budget.mean_per_layer(length) == kvpress_n_kept(length, float(ratio)), (ratio, length)
        assert budget.total(300, 36) == 36 * kvpress_n_kept(300, float(ratio)) and budget.follows_context
    assert (budget_choice("0.25cr"), budget_choice("0.3cr"), budget_choice("cr0.3")) == ("cr0.25", "cr0.3", "cr0.3")
    for bad in ("1cr", "1.5cr", "-0.2cr"):
        with pytest.raises(BudgetError, match="cr"):
            parse_budget(bad)


def test_leaderboard_dry_run_on_a_small_model(tmp_path: Path) -> None:
    """One job of ``+experiment=kvpress_leaderboard`` (PyramidKV as kvpress ships it, ratio 0.5) on a random 2-layer
    model with Llama-3.1's vocabulary and chat template: RULER 4K generated as kvpress's data (the Llama-3.1
    tokenizer's lengths, the base template) through the model's chat template, the question appended after
    compression, each layer at kvpress's pyramid of ``S / 2`` per layer on average (unrounded)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=prepare_overrides(
                [
                    "+experiment=kvpress_leaderboard",
                    "task=ruler",
                    "model=random-llama3.1",
                    "method=pyramidkv_kvpress",
                    "budget=cr0.5",
                    "task.num_samples=1",
                    "task.datasets=[niah_single_1]",
                    f"run.output_root={tmp_path}",
                    "run.progress=false",
                    "run.print_table=false",
                ]
            ),
        )
    assert len(Runner(validate_run(cfg)).run()) == 1
    folder = tmp_path / "random-llama3.1" / "ruler" / "pyramidkv_kvpress" / "cr0.5~kvpress_lb" / "niah_single_1"
    metrics = json.loads((folder / "metrics.json").read_text())
    prediction = json.loads((folder / "predictions.jsonl").read_text().splitlines()[0])
    settings = metrics["dataset_settings"]
    assert (metrics["question_mode"], settings["length"], settings["prompt_template"]) == ("agnostic", 4096, "model")
    # kvpress's data and pipeline: RULER's base-template samples sized with the Llama-3.1 tokenizer, the model's chat
    # template rendered with enable_thinking=False
    assert (settings["length_tokenizer"], settings["ruler_template"]) == ("llama3", None)
    assert (
        settings["chat_template_kwargs"] == {"enable_thinking": False} and not settings["length_counts_chat_template"]
    )
    context = prediction["context_tokens"]
    expected = kvpress_pyramid_budgets(context * (1 - 0.5), 64, 20, 2, context)  # kvpress's unrounded mean
    assert metrics["cache"]["mean_requested_per_layer"] == expected
    assert metrics["cache"]["mean_achieved_per_layer"] == expected


def test_leaderboard_table_puts_our_runs_beside_kvpress_cells(tmp_path: Path) -> None:
    """The table has one row per press and ratio (and no_press); kvpress's cells are empty with their reason (the
    numbers are not readable from the repository), ours is the mean of the 13 RULER tasks of the tagged run."""
    reference = load_reference("kvpress_leaderboard")
    assert len(reference) == 13 * 4 + 1 and reference["value"].isna().all()
    assert reference["note"].str.contains("nvidia/kvpress-leaderboard").all()
    scores = {dataset: 60.0 + index for index, dataset in enumerate(RULER13)}
    write_full_run(tmp_path, "qwen3-8b", "ruler", "knorm", "cr0.5", scores, tag="kvpress_lb", question_mode="agnostic")
    spec = TABLES["kvpress_leaderboard"]
    table = compare_table(spec, reference, load_runs(tmp_path))
    cell = table[(table["method"] == "knorm") & (table["budget"] == "cr0.5")].iloc[0]
    assert cell["ours"] == pytest.approx(sum(scores.values()) / 13) and math.isnan(cell["paper"])
    others = table[(table["method"] != "knorm") | (table["budget"] != "cr0.5")]
    assert others["ours"].isna().all()
    markdown = render_markdown(spec, table)
    assert "kvpress_leaderboard" in markdown and f"{sum(scores.values()) / 13:.2f}" in markdown
