"""Every method preset runs end to end on the embedded default model with every budget in conf/budget/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from kvbench.config import register_configs
from kvbench.runner import Runner

CONF = Path(__file__).resolve().parent.parent / "conf"
METHODS = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))
BUDGETS = sorted(p.stem for p in (CONF / "budget").glob("*.yaml"))


@pytest.mark.parametrize("method", METHODS)
def test_method_runs_with_every_budget(tmp_path: Path, method: str) -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for budget in BUDGETS:
            cfg = compose(
                "config",
                overrides=[
                    f"method={method}",
                    f"budget={budget}",
                    "task.lengths=[512]",
                    "task.num_samples=1",
                    "task.datasets=[niah_single_512]",
                    f"run.output_root={tmp_path}",
                    "run.progress=false",
                    "run.print_table=false",
                ],
            )
            results = Runner(cfg).run()
            assert len(results) == 1
            metrics_path = (
                tmp_path / cfg.model.name / "tiny_niah" / method / budget / "niah_single_512" / "metrics.json"
            )
            metrics = json.loads(metrics_path.read_text())
            cache = metrics["cache"]
            assert cache["budget_exact"], (method, budget, cache)
            if budget == "full" or method == "full":
                assert cache["samples_evicted"] == 0
