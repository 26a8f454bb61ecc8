"""Packaging: every third-party import is declared, the wheel carries the shipped files, ``kvbench list`` works.

Cheap: about 20 s on 2 shared cores (one in-tree wheel build 3 s; the listings import torch and compose every
preset, 2-5 s each).  The install of that wheel into a
fresh virtual environment, run from another folder, is tests/packaging/test_wheel_install.py (marked slow).
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kvbench import resources
from kvbench.app import listing

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
#: Import name -> distribution name, where they differ.
DISTRIBUTION = {"yaml": "PyYAML", "hydra": "hydra-core", "Levenshtein": "levenshtein"}
#: Imports that are an optional fallback for a declared package (tried only when that one is missing).
FALLBACK_FOR = {"Levenshtein": "rapidfuzz"}
#: The project's own top-level package (a top-level ``kernels`` would be Hugging Face's package, not ours).
FIRST_PARTY = {"kvbench"}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> dict[str, str]:
    """Declared distribution (normalised) -> where (``core`` or ``extra <name>``)."""
    where: dict[str, str] = {}
    groups = {"core": PYPROJECT["project"]["dependencies"]}
    groups.update({f"extra {k}": v for k, v in PYPROJECT["project"]["optional-dependencies"].items()})
    for group, requirements in groups.items():
        for requirement in requirements:
            name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
            where.setdefault(_normalise(name), group)
    return where


def third_party_imports() -> dict[str, set[str]]:
    """Top-level names imported anywhere under kvbench/ (absolute imports only) that are neither the standard
    library nor kvbench itself -> the files importing them."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / "kvbench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def test_every_third_party_import_is_declared() -> None:
    declared = _declared()
    imports = third_party_imports()
    assert {"torch", "transformers", "hydra", "yaml"} <= set(imports)  # the scan sees real imports
    missing = []
    for name, files in sorted(imports.items()):
        distribution = _normalise(FALLBACK_FOR.get(name) or DISTRIBUTION.get(name, name))
        if distribution not in declared:
            missing.append(f"{name} (distribution {distribution}; imported by {', '.join(sorted(files))})")
    assert not missing, "imported but not declared in pyproject.toml (core or an extra): " + "; ".join(missing)


def test_dependency_declarations() -> None:
    core = PYPROJECT["project"]["dependencies"]
    extras = PYPROJECT["project"]["optional-dependencies"]
    torch_requirement = next(r for r in core if _normalise(r).startswith("torch"))
    assert "==" not in torch_requirement and ">=" in torch_requirement  # a range: a cluster's CUDA build stays
    assert not any("flash" in r for group in extras.values() for r in group)  # no code imports flash-attn
    assert not any(_normalise(r).startswith("rouge") for r in core)  # only the ROUGE cross-check test uses it
    assert any(r.startswith("accelerate") for r in extras["dev"])
    assert PYPROJECT["project"]["scripts"]["kvbench"] == "kvbench.app.cli:main"
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"] == ["kvbench*"]


def test_resources_point_at_the_checkout() -> None:
    assert resources.shipped_root() == REPO
    assert resources.checkout_dir() == REPO
    assert (resources.conf_dir() / "config.yaml").is_file()
    assert (resources.tasks_dir() / "longbench" / "datasets.json").is_file()
    assert (resources.models_dir() / "tiny-niah" / "config.json").is_file()
    assert (resources.paper_dir() / "cake_t1.csv").is_file()


def test_no_module_builds_paths_from_its_own_location() -> None:
    """Shipped folders are found through kvbench.resources only (the same code then works from a wheel)."""
    pattern = re.compile(r"Path\(__file__\)[^\n]*\.(parents\[|parent\.parent)")
    offenders = [
        str(path.relative_to(REPO))
        for path in sorted([*(REPO / "kvbench").rglob("*.py"), *(REPO / "scripts").glob("*.py")])
        if path.name != "resources.py" and pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, offenders


def test_wheel_contents(tmp_path: Path) -> None:
    """The wheel holds kvbench (no top-level ``kernels``), the shipped data under kvbench/_shipped (no scripts),
    and the console script."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(REPO), "-w", tmp_path],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("kvbench-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"kvbench"}
    shipped = "kvbench/_shipped/"
    for required in (
        "conf/config.yaml",
        "conf/method/snapkv.yaml",
        "conf/hydra/launcher/slurm.yaml",
        "tasks/longbench/datasets.json",
        "models/tiny-niah/model.safetensors",
        "models/chat_templates/llama3.jinja",
        "results/paper/cake_t1.csv",
    ):
        assert shipped + required in names, required
    source_conf = {str(p.relative_to(REPO)) for p in (REPO / "conf").rglob("*.yaml")}
    assert {n[len(shipped) :] for n in names if n.startswith(shipped + "conf/")} == source_conf
    assert not [n for n in names if n.startswith(shipped) and n.endswith((".py", ".pyc"))]
    assert "kvbench = kvbench.app.cli:main" in entry_points


@pytest.fixture(scope="module")
def listed() -> dict[str, tuple[int, str]]:
    """``{target: (exit status, stdout)}`` of ``kvbench list <target>`` (:func:`kvbench.app.listing.main`) for every
    target, each listed once per module: the listings compose every preset (2-5 s each), and both tests below read
    them."""
    out = {}
    for target in listing.LISTINGS:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            status = listing.main([target])
        out[target] = (status, printed.getvalue())
    return out


@pytest.mark.parametrize("target", list(listing.LISTINGS))
def test_list_every_target(target: str, listed: dict[str, tuple[int, str]]) -> None:
    status, out = listed[target]
    assert status == 0
    group = target.removesuffix("s")
    presets = sorted(p.stem for p in (resources.conf_dir() / group).glob("*.yaml"))
    rows = {line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.split()}
    assert set(presets) <= rows, f"presets missing from `kvbench list {target}`: {set(presets) - rows}"


def test_list_contents(listed: dict[str, tuple[int, str]]) -> None:
    methods = listed["methods"][1]
    cake = next(line for line in methods.splitlines() if line.split()[:2] == ["cake", "cake"])
    assert "kernel_size=5" in cake and "gamma=200.0" in cake and "allocation=p2a" in cake
    assert "\n    window = 32: Observation window" in methods  # each knob once, with its default and meaning
    # Which heads each preset stores, and what a budget then means in memory (the query-head storage trap, #32).
    rows = {line.split()[0]: line for line in methods.splitlines() if line.startswith("  ")}
    assert "query heads" in rows["snapkv"] and "KV heads" in rows["streamingllm"]
    assert "r x H_q/H_kv x the full cache" in methods
    tasks = listed["tasks"][1]
    assert "datasets (16): narrativeqa, qasper" in tasks and "niah_single_2k, niah_multikey_2k" in tasks
    models = listed["models"][1]
    assert re.search(r"tiny\s+local\s+llama\s+8192", models)
    assert re.search(r"llama3-8b-instruct\s+hub\s+llama\s+7500", models)
    budgets = listed["budgets"][1]
    assert re.search(r"128perlayer\s+128/layer\s+exactly 128 tokens per head in every layer", budgets)
    assert re.search(r"ratio0\.2\s+0\.2x\s+keep 0\.2 of the context", budgets)


@pytest.mark.parametrize("argv", [["metods"], [], ["methods", "tasks"]])
def test_list_bad_target(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert listing.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "valid: methods, tasks, models, budgets, kv_quant" in err
    if argv == ["metods"]:
        assert "unknown list target 'metods' (did you mean 'methods'?)" in err
