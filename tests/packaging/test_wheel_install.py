"""Acceptance (issue #21): the wheel installs into a fresh virtual environment outside the checkout and its
``kvbench`` command runs the embedded default and ``kvbench list methods`` from another folder.

Marked slow: about 55 s on 2 shared cores (wheel build, venv and install 12 s; ``kvbench list`` twice 10 s; the
embedded default with ``task.num_samples=1`` 34 s).  The venv reuses this environment's torch and transformers
(``--system-site-packages``, and a ``.pth`` naming the running interpreter's site-packages, so that it works from
inside a virtualenv too: :func:`see_running_environment`) and installs only the wheel (``--no-deps``); nothing is
downloaded.

``kvbench`` alone (the embedded default, four runs of 10 samples per dataset) takes about 2.5 min on 2 shared
cores, so the test runs it with the quick override ``task.num_samples=1``: the same four runs side by side (an
extent override keeps the embedded default, as in ``python run.py``), one sample per dataset; the full demo is the
code path that tests/end_to_end/test_tiny_model_eviction.py runs through ``python run.py``.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    """The environment without anything that would put a checkout's kvbench on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "KVBENCH_DEBUG")}
    return {**env, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}


def _run(command: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (outside the checkout) with the kvbench wheel installed; returns its bin/ folder."""
    root = tmp_path_factory.mktemp("wheel_install")
    assert REPO not in root.parents
    wheels = root / "wheels"
    build = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(REPO), "-w", wheels],
        cwd=root,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("kvbench-*.whl")
    venv = root / "venv"
    created = _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=root)
    assert created.returncode == 0, created.stderr
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    see_running_environment(bin_dir / "python")
    install = _run([str(bin_dir / "python"), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], cwd=root)
    assert install.returncode == 0, install.stderr
    return bin_dir


def running_site_dirs() -> list[str]:
    """The site-packages folders of the interpreter running the tests: a virtualenv's own (where `make setup` put
    the dependencies) and, where it includes them, the base interpreter's."""
    return [path for path in site.getsitepackages() if Path(path).is_dir()]


def see_running_environment(python: Path) -> None:
    """Let the new venv import the running interpreter's packages.  ``--system-site-packages`` alone adds the *base*
    interpreter's site-packages, which inside a virtualenv are not where the dependencies are
    (``ModuleNotFoundError: omegaconf``); a ``.pth`` file in the new venv names the running interpreter's folders
    (paths only: the editable kvbench there is not activated, its ``.pth`` is not read)."""
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=python.parent)
    assert purelib.returncode == 0, purelib.stderr
    (Path(purelib.stdout.strip()) / "_kvbench_test_running_env.pth").write_text("\n".join(running_site_dirs()) + "\n")


def test_the_venv_sees_the_running_environment_not_only_the_base_interpreter(installed: Path, tmp_path: Path) -> None:
    """From inside a virtualenv too (issue #42): every site-packages folder of the running interpreter is on the new
    venv's path, after its own (so the wheel's kvbench wins)."""
    probe = _run([str(installed / "python"), "-c", "import json, sys; print(json.dumps(sys.path))"], cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    path = [str(Path(p).resolve()) for p in json.loads(probe.stdout)]
    own = str(Path(installed.parent, "lib").resolve())
    for folder in running_site_dirs():
        assert str(Path(folder).resolve()) in path, (folder, path)
    assert min(i for i, p in enumerate(path) if p.startswith(own)) < min(
        path.index(str(Path(folder).resolve())) for folder in running_site_dirs()
    )


def test_installed_kvbench_is_the_wheel(installed: Path, tmp_path: Path) -> None:
    code = "import kvbench, kvbench.resources as r; print(kvbench.__file__, r.conf_dir(), r.checkout_dir(), sep='\\n')"
    probe = _run([str(installed / "python"), "-c", code], cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    module_file, conf_dir, checkout = probe.stdout.split("\n")[:3]
    venv = installed.parent.resolve()
    assert venv in Path(module_file).resolve().parents, module_file  # not the checkout's kvbench
    assert Path(conf_dir) == Path(module_file).parent / "_shipped" / "conf"
    assert checkout == "None"


def test_kvbench_list_methods_from_another_folder(installed: Path, tmp_path: Path) -> None:
    listed = _run([str(installed / "kvbench"), "list", "methods"], cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    for preset, family in (("snapkv", "snapkv"), ("cake", "cake"), ("ada_snapkv", "ada_snapkv"), ("nacl", "nacl")):
        assert any(line.split()[:2] == [preset, family] for line in listed.stdout.splitlines()), preset
    assert "Registered method families:" in listed.stdout
    bad = _run([str(installed / "kvbench"), "list", "nope"], cwd=tmp_path)
    assert bad.returncode == 2 and "valid: methods, tasks, models, budgets" in bad.stderr
    assert not (tmp_path / "results").exists()  # listing writes nothing


def test_kvbench_embedded_default_from_another_folder(installed: Path, tmp_path: Path) -> None:
    run = _run([str(installed / "kvbench"), "task.num_samples=1"], cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    folder = tmp_path / "results" / "runs" / "tiny" / "tiny_niah" / "snapkv" / "64L"
    assert f"results (snapkv q-aware): {folder.relative_to(tmp_path)}" in run.stdout
    assert "full cache" in run.stdout and "StreamingLLM" in run.stdout  # the embedded default's comparison
    meta = json.loads((folder / "run_meta.json").read_text())
    assert meta["status"] == "complete" and meta["git_commit"] is None  # an installed wheel: no checkout commit
    for dataset in ("niah_single_2k", "niah_multikey_2k", "niah_multivalue_2k"):
        metrics = json.loads((folder / dataset / "metrics.json").read_text())
        assert metrics["n_samples"] == 1 and metrics["metric"] == "string_match_all"
        assert 0.0 <= metrics["score"] <= 100.0
        assert len((folder / dataset / "predictions.jsonl").read_text().splitlines()) == 1
    # Hydra's logs beside the results root (results/logs/hydra), not in the current folder (issue #42).
    assert (tmp_path / "results" / "logs" / "hydra" / "tiny" / "tiny_niah" / "snapkv" / "64L" / "kvbench.log").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]
    site_packages = next(installed.parent.glob("lib/python*/site-packages"))
    assert not list(site_packages.glob("**/results/runs"))  # nothing written inside the installed package
