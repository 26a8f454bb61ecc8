"""The "Add a method" page's reuse example (issue #57): ``class VATP(SnapKV)``, as written on the page, scores
SnapKV's votes times each token's value L1 norm, and runs through ``python run.py method=vatp_demo budget=64L
method.params.allocation=ada_kvpress`` (run.py's entry point, in process, with the page's class defined first: a
class defined in the user's own script composes by name)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from kvbench.eviction.base import METHOD_FAMILIES, WindowObservation, build_method

PAGE = Path(__file__).resolve().parents[2] / "docs" / "methods" / "add-a-method.md"


def page_code() -> str:
    """The page's ``<!-- method-example: vatp_demo -->`` block."""
    found = re.search(r"<!-- method-example: vatp_demo -->\s*```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    assert found, "the page lost its VATP example"
    return found[1]


@pytest.fixture
def vatp():
    """The page's class, defined as the page writes it (and unregistered afterwards)."""
    namespace: dict = {"__name__": "vatp_demo"}
    exec(compile(page_code(), f"{PAGE}:vatp_demo", "exec"), namespace)
    yield namespace["VATP"]
    METHOD_FAMILIES.unregister("vatp_demo")


def test_the_example_is_at_most_15_lines_of_method_code() -> None:
    code = page_code()
    method = code[code.index("@dataclass") :].strip().splitlines()
    assert len([line for line in method if line.strip()]) <= 15, method


def test_vatp_multiplies_snapkvs_score_by_the_values_l1_norm(vatp) -> None:
    """On a hand-made layer: VATP's score is SnapKV's (same knobs) times ``|v|_1`` per stored head and token, so a
    token whose value is 100x larger outranks SnapKV's choice."""
    torch.manual_seed(0)
    heads, length, dim = 2, 24, 8
    keys, values = torch.randn(heads, length, dim), torch.rand(heads, length, dim)
    values[:, 3] *= 100.0
    observation = WindowObservation(0, 1, torch.randn(heads, 4, dim), keys, values, dim**-0.5)
    node = {"name": "vatp_demo", "family": "vatp_demo", "params": {"window": 4, "kernel_size": 1}}
    vatp_scores = build_method(node).scorer.score(observation)
    snapkv = build_method({**node, "name": "snapkv", "family": "snapkv"}).scorer.score(observation)
    assert torch.equal(vatp_scores, snapkv * values.norm(p=1, dim=-1))
    assert (vatp_scores[:, : length - 4].argmax(dim=-1) == 3).all()


def test_runs_through_run_py_under_kvpress_ada_allocation(vatp, tmp_path, monkeypatch) -> None:
    """``python run.py method=vatp_demo budget=64L method.params.allocation=ada_kvpress`` (one sample of one dataset
    of the embedded default): the folder names the wrapper, each layer keeps 64 tokens per KV head on average, split
    unevenly over the heads (Ada-KV), and the run records VATP's knobs."""
    from kvbench.app.cli import main

    root = tmp_path / "runs"
    args = ["method=vatp_demo", "budget=64L", "method.params.allocation=ada_kvpress", "task.num_samples=1"]
    args.append("task.datasets=[niah_single_2k]")  # one of the embedded default's three datasets: CI time
    monkeypatch.setattr(sys, "argv", ["run.py", *args, f"run.output_root={root}", "run.progress=false"])
    main()
    folder = root / "tiny" / "tiny_niah" / "vatp_demo+ada_kvpress" / "64L"
    rows = [json.loads(line) for path in folder.glob("*/predictions.jsonl") for line in path.read_text().splitlines()]
    assert len(rows) == 1
    for row in rows:
        per_head = row["cache"]["achieved_per_head"]
        assert all(sum(layer) == 64 * len(layer) for layer in per_head) and any(len(set(h)) > 1 for h in per_head)
    metrics = json.loads(next(folder.glob("*/metrics.json")).read_text())
    assert metrics["settings"]["method_family"] == "vatp_demo"
    assert metrics["settings"]["params"]["allocation"] == "ada_kvpress"
