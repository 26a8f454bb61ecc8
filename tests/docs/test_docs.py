"""The documentation (issue #36): a short README, a site that builds with ``mkdocs build --strict`` (a broken link,
anchor or missing page fails), examples that run as shown, and commands that name real things.

* ``python`` blocks after a ``<!-- docs-example -->`` marker in ``docs/**/*.md`` run as written; every
  ``print(...)  # <text>`` line's comment must appear in what the block printed.  (The Python API page's
  ``<!-- api-example -->`` block is run by ``tests/test_api.py``.)
* Every command shown in a ``bash`` block of the README or the docs: ``make`` targets exist in the Makefile,
  ``scripts/*.py`` exist, and every ``python run.py`` / ``kvbench`` command names existing presets; the single
  runs (no ``-m``) are composed and checked as ``run.py`` would before any work
  (:func:`kvbench.app.validation.check_config`).
* Every ``tests/``, ``scripts/``, ``conf/`` and ``slurm/`` path the pages name in inline code exists.
* The user pages (:data:`USER_PAGES`: the front page and getting started) mark every ``bash`` block: ``<!-- runnable
  -->`` blocks are executed here, as shown, in one scratch working directory per page (blocks in page order, so a
  report sees the runs before it); ``<!-- runnable: tests/<file>.py -->`` blocks are executed by that test instead
  (the embedded default by ``tests/end_to_end/test_tiny_model_eviction.py``, which also compares its printed table
  with the front page's); ``<!-- not-runnable: <why> -->`` blocks (installs, GPUs, hub models, SLURM) are checked
  like every other block.  The runnable blocks use tiny settings (the tiny model, 1K tokens, 2 samples).

About 10 s on 2 shared cores for the site build; the runnable blocks took 28 s of CPU (25 s user + 2 s system, one
torch thread per command; 2 minutes wall at load average 10).
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
#: The README stays a front door (issue #36: at most ~300 lines).
README_MAX_LINES = 300
#: The pages a new user reads first: every bash block on them says whether and where it is executed.
USER_PAGES = ("docs/index.md", "docs/getting-started.md")
#: The marker before a bash block on a user page: ``runnable``, ``runnable: <test file>`` or ``not-runnable: <why>``.
MARKER = re.compile(
    r"<!-- (runnable|not-runnable|compose-only)(?::\s*(.+?))? -->\s*\n```bash\n(.*?)^```", re.DOTALL | re.MULTILINE
)
#: Config groups a command-line override may name, with the folder of their presets.
GROUPS = {"method": "method", "task": "task", "model": "model", "budget": "budget", "+experiment": "experiment"}


def pages() -> list[Path]:
    """README.md and every Markdown page of the site."""
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def fenced_blocks(text: str, language: str) -> list[str]:
    """The bodies of the fenced code blocks of ``language`` in a Markdown text."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def commands(block: str) -> list[list[str]]:
    """The commands of a bash block as argument lists: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            found.append(shlex.split(line, comments=True))
    return found


def shown_commands() -> list[tuple[str, list[str]]]:
    """(page, argument list) for every command in every bash block of the README and the docs."""
    return [
        (str(page.relative_to(REPO)), argv)
        for page in pages()
        for block in fenced_blocks(page.read_text(encoding="utf-8"), "bash")
        for argv in commands(block)
    ]


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z0-9_-]+):", text, flags=re.MULTILINE))


def test_readme_is_a_short_front_door() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES, f"README.md has {len(text.splitlines())} lines"
    for needed in ("make setup", "python run.py", "docs/index.md", "| niah_single_2k |"):
        assert needed in text, f"README.md lost {needed!r}"


def test_readme_links_point_at_existing_pages() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert links, "README.md links to no page"
    missing = [link for link in links if "://" not in link and not (REPO / link).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_site_builds_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict``: warnings (a broken link or anchor, a nav entry without a page, a docstring
    mkdocstrings cannot render) fail the build."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    process = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    built = tmp_path / "site"
    for family_page in ("methods/snapkv/index.html", "methods/cake/index.html", "api/index.html"):
        assert (built / family_page).is_file(), family_page
    snapkv = (built / "methods/snapkv/index.html").read_text(encoding="utf-8")
    assert "FasterDecoding/SnapKV" in snapkv and "Parity evidence" in snapkv and "test_snapkv.py" in snapkv
    assert "test_reference_parity.py" in snapkv  # a cross-family suite parametrized over its presets
    version = re.search(r'^__version__ = "([^"]+)"', (REPO / "kvbench/version.py").read_text(), re.MULTILINE)
    assert version and f"This site documents kvbench {version.group(1)}" in snapkv  # once, in the footer
    index = (built / "index.html").read_text(encoding="utf-8")
    assert index.count(f"kvbench {version.group(1)}") == 1 and "admonition note" not in index  # no version box
    assert (built / "stylesheets/extra.css").is_file() and "stylesheets/extra.css" in index  # the wider column
    assert "kvbench.api.evaluate" in (built / "api/index.html").read_text(encoding="utf-8")
    # A one-class method gets its page and nav entry with no edit: its knobs, reference and test file's evidence.
    knorm = (built / "methods/knorm/index.html").read_text(encoding="utf-8")
    assert "kvpress/presses/knorm_press.py" in knorm and "test_knorm.py" in knorm
    # Every registered family has a page in the nav, listing the tests of tests/methods/test_<family>.py.
    for family in kvbench_families():
        page = (built / f"methods/{family}/index.html").read_text(encoding="utf-8")
        assert f'href="methods/{family}/"' in index, f"methods/{family}.md is not in the nav"
        names = defined_tests(REPO / "tests" / "methods" / f"test_{family}.py")
        assert names and all(name in page for name in names), f"methods/{family}.md lacks its tests' evidence"


def kvbench_families() -> list[str]:
    """The method families kvbench defines: the method registry, less the installed packages' plug-ins."""
    from kvbench.eviction.base import method_families
    from kvbench.eviction.plugins import PLUGIN_PACKAGES

    return [family for family in method_families() if family not in PLUGIN_PACKAGES]


def defined_tests(path: Path) -> list[str]:
    """The ``test_*`` functions of a test file (read with :mod:`ast`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


def test_every_method_family_has_its_test_file() -> None:
    """Every method family kvbench registers (YAML presets and one-class methods) has ``tests/methods/test_<family>.py``
    with at least one test: its docs page lists that file's tests as the family's evidence
    (``scripts/mkdocs_hooks.py``)."""
    missing = [
        f"{family}: tests/methods/test_{family}.py"
        for family in kvbench_families()
        if not (REPO / "tests" / "methods" / f"test_{family}.py").is_file()
        or not defined_tests(REPO / "tests" / "methods" / f"test_{family}.py")
    ]
    assert not missing, "method families without their test file (the evidence of their docs page):\n" + "\n".join(
        missing
    )


def docs_examples() -> list[tuple[str, str]]:
    """(page, code) for every ``<!-- docs-example -->`` Python block of the site."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for code in re.findall(r"<!-- docs-example -->\s*```python\n(.*?)```", text, flags=re.DOTALL):
            found.append((str(page.relative_to(REPO)), code))
    return found


@pytest.mark.parametrize(("page", "code"), docs_examples(), ids=lambda value: value if value.endswith(".md") else "")
def test_docs_example_runs_and_prints_what_it_says(page: str, code: str, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(code, f"{page}:docs-example", "exec"), {"__name__": "docs_example"})
    out = capsys.readouterr().out
    for expected in re.findall(r"^\s*print\(.*\)\s+#\s*(.+)$", code, flags=re.MULTILINE):
        assert expected.strip() in out, f"{page}: printed {out!r}, the comment says {expected!r}"


def test_docs_examples_exist() -> None:
    assert docs_examples(), "no <!-- docs-example --> block under docs/"


def test_shown_make_targets_and_scripts_exist() -> None:
    targets = makefile_targets()
    problems = []
    for page, argv in shown_commands():
        if argv[0] == "make" and len(argv) > 1 and argv[1] not in targets and "=" not in argv[1]:
            problems.append(f"{page}: make {argv[1]} (no such Makefile target)")
        for arg in argv:
            if re.fullmatch(r"(scripts|slurm)/[\w./-]+\.(py|sh|sbatch)", arg) and not (REPO / arg).is_file():
                problems.append(f"{page}: {arg} does not exist")
    assert not problems, "\n".join(problems)


def run_commands() -> list[tuple[str, list[str]]]:
    """(page, overrides) for every ``python run.py`` / ``kvbench`` run command shown (not ``kvbench <subcommand>``)."""
    found = []
    for page, argv in shown_commands():
        if argv[:2] == ["python", "run.py"]:
            found.append((page, argv[2:]))
        elif argv[0] == "kvbench" and (len(argv) == 1 or "=" in argv[1] or argv[1].startswith("-")):
            found.append((page, argv[1:]))  # not a subcommand (list, report, wandb-report)
    return found


def test_shown_run_commands_name_existing_presets() -> None:
    conf = REPO / "conf"
    problems, checked = [], 0
    for page, overrides in run_commands():
        for override in overrides:
            key, _, value = override.partition("=")
            if key in GROUPS and value:
                for name in value.split(","):
                    checked += 1
                    budget_string = key == "budget" and re.fullmatch(r"\d+(L|/layer)|[\d.]+x|full", name)
                    if not budget_string and not (conf / GROUPS[key] / f"{name}.yaml").is_file():
                        problems.append(f"{page}: {override}: no conf/{GROUPS[key]}/{name}.yaml")
    assert checked > 20, "the scan found too few commands"
    assert not problems, "\n".join(problems)


def test_shown_single_runs_compose_and_validate() -> None:
    """A single run shown in the docs composes and passes run.py's config checks (no model, no data)."""
    import kvbench
    from kvbench.app.validation import check_config
    from kvbench.errors import KVBenchError

    composed = 0
    for page, overrides in run_commands():
        if "-m" in overrides or "--multirun" in overrides or any("," in o and "{" not in o for o in overrides):
            continue
        chosen = {"method": "snapkv", "budget": "64L", "task": "tiny_niah", "model": None}
        rest = []
        for override in overrides:
            key, _, value = override.partition("=")
            if key in chosen:
                chosen[key] = value
            elif not key.startswith("hydra"):
                rest.append(override)
        try:
            check_config(kvbench.compose_config(**chosen, overrides=rest))
        except KVBenchError as err:
            pytest.fail(f"{page}: {' '.join(overrides)}: {err}")
        composed += 1
    assert composed >= 5, composed


def test_paths_named_in_the_pages_exist() -> None:
    problems = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        for path in re.findall(r"`((?:tests|scripts|conf|slurm)/[\w./-]+\.(?:py|yaml|sh|sbatch))`", text):
            if "*" not in path and "<" not in path and not (REPO / path).is_file():
                problems.append(f"{page.relative_to(REPO)}: {path}")
    assert not problems, "named but missing:\n" + "\n".join(problems)


def marked_blocks(page: str) -> list[tuple[str, str, str]]:
    """(kind, detail, body) of every marked bash block of a page, in page order."""
    return MARKER.findall((REPO / page).read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", USER_PAGES)
def test_every_command_block_on_a_user_page_is_marked(page: str) -> None:
    """Each bash block says whether the docs tests run it (``runnable``), which test does (``runnable: <file>``), or
    why it cannot run here (``not-runnable: <why>``)."""
    text = (REPO / page).read_text(encoding="utf-8")
    blocks = fenced_blocks(text, "bash")
    marked = marked_blocks(page)
    assert len(marked) == len(blocks), f"{page}: {len(blocks) - len(marked)} bash block(s) without a marker"
    for kind, detail, _ in marked:
        assert kind == "runnable" or detail, f"{page}: not-runnable without a reason"
        if kind == "runnable" and detail:
            assert (REPO / detail).is_file(), f"{page}: runnable by {detail}, which does not exist"
    assert any(kind == "runnable" and not detail for kind, detail, _ in marked) or page == "docs/index.md"


def shell_argv(argv: list[str]) -> list[str]:
    """A shown command as this test runs it: ``python`` is this interpreter, ``run.py`` and ``scripts/`` are the
    checkout's (the command runs in a scratch folder), ``kvbench`` is ``python -m kvbench``."""
    if argv[0] == "kvbench":
        argv = ["python", "-m", "kvbench", *argv[1:]]
    assert argv[0] == "python", f"only python / kvbench commands are runnable here: {argv}"
    rest = [str(REPO / arg) if arg == "run.py" or arg.startswith("scripts/") else arg for arg in argv[1:]]
    return [sys.executable, *rest]


def test_method_files_shown_in_the_docs_are_the_files() -> None:
    """A ``<!-- method-file: <path> -->`` block (the "Add a method" page's KNorm) is that file, byte for byte: the
    page shows the code that runs (``python run.py method=knorm``, the generic suites, the docs example)."""
    shown = 0
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for path, code in re.findall(r"<!-- method-file: (\S+) -->\s*```python\n(.*?)```", text, flags=re.DOTALL):
            assert (REPO / path).read_text(encoding="utf-8") == code, f"{page}: the block differs from {path}"
            shown += 1
    assert shown >= 1
