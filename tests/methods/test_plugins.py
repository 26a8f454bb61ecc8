"""A method from another package (entry-point group ``kvbench.methods``): installed into a temporary folder (never
into the interpreter running the tests), listed by ``kvbench list methods``, run through ``run.py`` with no YAML, its
package and version recorded in ``run_meta.json`` and in the config (so in the config hash)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PACKAGE = Path(__file__).resolve().parents[1] / "fixtures" / "plugin_method"


def test_a_method_from_another_package_is_listed_and_runs(tmp_path: Path) -> None:
    source, site = tmp_path / "source", tmp_path / "site"
    shutil.copytree(PACKAGE, source)  # setuptools builds in the source tree: keep the fixture clean
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip, "--target", str(site), str(source)], check=True, capture_output=True, timeout=300)
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), str(REPO), env.get("PYTHONPATH")]))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)

    listing = run("-m", "kvbench", "list", "methods")
    assert listing.returncode == 0, listing.stderr[-2000:]
    (row,) = [line for line in listing.stdout.splitlines() if line.strip().startswith("keep_largest_norm")]
    assert "[package: kvbench-example-method 0.1.0]" in row

    overrides = ["task.lengths=[512]", "task.datasets=[niah_single_512]", "task.num_samples=1"]
    result = run("run.py", "method=keep_largest_norm", "budget=0.5x", *overrides, f"run.output_root={tmp_path / 'r'}")
    assert result.returncode == 0, result.stderr[-3000:]
    folder = tmp_path / "r" / "tiny" / "tiny_niah" / "keep_largest_norm" / "ratio0.5"
    assert (folder / "niah_single_512" / "predictions.jsonl").read_text().count("\n") == 1
    package = {"package": "kvbench-example-method", "version": "0.1.0"}
    assert json.loads((folder / "run_meta.json").read_text())["method_package"] == package
    reference = yaml.safe_load((folder / "config.yaml").read_text())["method"]["reference"]
    assert {key: reference[key] for key in package} == package
