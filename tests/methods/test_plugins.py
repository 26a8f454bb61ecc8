"""A method from another package (entry-point group ``kvbench.methods``): installed into a temporary folder (never
into the interpreter running the tests), listed by ``kvbench list methods``, run through ``run.py`` with no YAML, its
package and version recorded in ``run_meta.json`` and in the config (so in the config hash).

The run is ``python run.py -m method=keep_largest_norm budget=80L,0.3x,512``, so it is also issue #41 item 5's
multirun of budget specs (three jobs into the folders 80L, ratio0.3 and 512L; tests/run/test_budget_specs.py checks
the specs' composition, folders and hashes in process).  The listing and the run share one interpreter
(:data:`DRIVER`: ``kvbench.app.cli.main`` with the argv of ``kvbench list methods``, then with the argv of ``python
run.py ...``; the code paths of the two commands), so the test pays for one start of torch and transformers, not
three.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PACKAGE = Path(__file__).resolve().parents[1] / "fixtures" / "plugin_method"
#: The budget specs of the multirun and the folders their jobs write.
SPEC_FOLDERS = {"80L": "80L", "0.3x": "ratio0.3", "512": "512L"}
#: One interpreter, two commands: ``kvbench list methods`` (its exit status printed after a marker line), then
#: ``python run.py <argv[1:]>``; both through :func:`kvbench.app.cli.main`, as the console script and run.py call it.
DRIVER = """
import sys
from kvbench.app.cli import main
run_argv = sys.argv[1:]
sys.argv = ["kvbench", "list", "methods"]
try:
    main()
except SystemExit as stop:
    print(f"=== list exit {stop.code or 0}", flush=True)
sys.argv = ["run.py", *run_argv]
main()
"""


@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """(the driver's completed process, the results root) after installing the example package into a temporary
    folder and running the listing and the multirun with it on the path."""
    tmp_path = tmp_path_factory.mktemp("plugin")
    source, site = tmp_path / "source", tmp_path / "site"
    shutil.copytree(PACKAGE, source)  # setuptools builds in the source tree: keep the fixture clean
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip, "--target", str(site), str(source)], check=True, capture_output=True, timeout=300)
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), str(REPO), env.get("PYTHONPATH")]))
    root = tmp_path / "r"
    overrides = ["task.lengths=[512]", "task.datasets=[niah_single_512]", "task.num_samples=1", "run.print_table=false"]
    args = ["-m", "method=keep_largest_norm", f"budget={','.join(SPEC_FOLDERS)}", *overrides, f"run.output_root={root}"]
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    return result, root


def test_a_method_from_another_package_is_listed_and_runs(plugin_run) -> None:
    result, root = plugin_run
    assert result.returncode == 0, result.stderr[-3000:]
    listing, _, _ = result.stdout.partition("=== list exit 0\n")
    assert "=== list exit 0" in result.stdout, result.stdout[-2000:]
    (row,) = [line for line in listing.splitlines() if line.strip().startswith("keep_largest_norm")]
    assert "[package: kvbench-example-method 0.1.0]" in row

    folder = root / "tiny" / "tiny_niah" / "keep_largest_norm" / "ratio0.3"
    assert (folder / "niah_single_512" / "predictions.jsonl").read_text().count("\n") == 1
    package = {"package": "kvbench-example-method", "version": "0.1.0"}
    assert json.loads((folder / "run_meta.json").read_text())["method_package"] == package
    reference = yaml.safe_load((folder / "config.yaml").read_text())["method"]["reference"]
    assert {key: reference[key] for key in package} == package


def test_run_py_runs_budget_specs_in_a_multirun(plugin_run) -> None:
    """``python run.py -m ... budget=80L,0.3x,512`` runs three jobs into the folders 80L, ratio0.3 and 512L (issue #41
    item 5; moved here from tests/run/test_budget_specs.py to share the plug-in's run)."""
    result, root = plugin_run
    assert result.returncode == 0, result.stderr[-3000:]
    method_dir = root / "tiny" / "tiny_niah" / "keep_largest_norm"
    assert sorted(path.name for path in method_dir.iterdir()) == sorted(SPEC_FOLDERS.values())
    for budget in SPEC_FOLDERS.values():
        assert (method_dir / budget / "niah_single_512" / "predictions.jsonl").read_text().count("\n") == 1
