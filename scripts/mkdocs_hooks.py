"""MkDocs hooks for kvbench's documentation site (``mkdocs.yml``: ``hooks: [scripts/mkdocs_hooks.py]``).

Generated at build time, so they cannot drift from the code:

* the kvbench version the site documents (``kvbench/version.py``'s ``__version__``), once, in the footer of every
  page (``copyright``), not in each page's text;
* one page per method family, ``methods/<family>.md``, from ``conf/method/*.yaml``: for each preset its header
  comment, its settings and its ``reference:`` block (repo, commit, file, what it reproduces);
* one page per one-class method (``kvbench/methods/<family>.py``, read with :mod:`ast`): its docstring, knobs and
  reference;
* on every family's page its evidence: the tests of ``tests/methods/test_<family>.py`` (names and docstrings; every
  registered family has that file, ``tests/docs/test_docs.py`` checks it, and a page without it is a warning,
  which fails ``mkdocs build --strict``), then the cross-family suites' tests parametrized over one of its presets;
* the nav's ``Methods`` section gains every method page it does not list (a new method needs no nav edit).

The module reads files only (no kvbench import), so ``mkdocs build`` works without torch.
"""

from __future__ import annotations

import ast
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: Warnings here are counted by MkDocs (the ``mkdocs`` logger): ``mkdocs build --strict`` fails on them.
LOG = logging.getLogger("mkdocs.hooks.kvbench")
#: The checkout being documented: the folder of ``mkdocs.yml`` (set by :func:`on_config`).
REPO = Path.cwd()

#: Family -> how the switch table of ``docs/methods/index.md`` names it (a row mentioning one is the family's).
SWITCH_NAMES: dict[str, tuple[str, ...]] = {
    "streamingllm": ("StreamingLLM",),
    "h2o": ("H2O",),
    "tova": ("TOVA",),
    "nacl": ("NACL",),
    "snapkv": ("SnapKV",),
    "pyramidkv": ("`pyramidkv`", "PyramidKV"),
    "ada_snapkv": ("Ada-KV",),
    "ada_pyramidkv": ("Ada-KV", "ada_pyramidkv"),
    "cake": ("CAKE",),
    "ahakv": ("AhaKV",),
    "xkv": ("XKV",),
}
#: The hand-written methods page whose tables the family pages quote (relative to the checkout).
METHODS_PAGE = Path("docs") / "methods" / "index.md"
#: Folders under ``tests/`` whose parametrized tests are listed on a family page when a ``@pytest.mark.parametrize``
#: value is one of the family's preset names (the suites that run several families' presets).
CROSS_FAMILY_FOLDERS = ("methods", "parity")
#: Settings shown per preset (``reference`` has its own block; these describe the preset file itself).
HIDDEN_KEYS = {"defaults", "reference", "name", "family"}


def kvbench_version() -> str:
    """``__version__`` from ``kvbench/version.py`` (read as text: building the docs imports nothing)."""
    text = (REPO / "kvbench" / "version.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__ = "([^"]+)"', text, flags=re.MULTILINE)
    if not match:
        raise RuntimeError("kvbench/version.py has no __version__ line")
    return match.group(1)


@dataclass
class Preset:
    """One ``conf/method/<name>.yaml``: its settings and the comment lines above ``name:``."""

    name: str
    settings: dict[str, Any]
    comment: str
    reference_text: str


@dataclass
class TestEvidence:
    """A test function: ``tests/<file>::<name>``, the first paragraph of its docstring, and the strings its
    ``@pytest.mark.parametrize`` decorators pass (the presets a cross-family test runs)."""

    file: str
    name: str
    summary: str
    parameters: set[str] = field(default_factory=set)


def reference_block(yaml_text: str) -> str:
    """The ``reference:`` block of a preset file verbatim (from its line to the next top-level key), or ``""``."""
    lines = yaml_text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("reference:"):
            block = [line]
            for following in lines[index + 1 :]:
                if following and not following.startswith((" ", "#")):
                    break
                block.append(following)
            return "\n".join(block).rstrip()
    return ""


def read_presets() -> dict[str, list[Preset]]:
    """Family -> its presets, in file-name order."""
    families: dict[str, list[Preset]] = {}
    for path in sorted((REPO / "conf" / "method").glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        settings = yaml.safe_load(text) or {}
        comment_lines = []
        for line in text.splitlines():
            if line.startswith("#"):
                comment_lines.append(line.lstrip("#").strip())
            elif comment_lines and not line.startswith("  ") and not line.startswith("-"):
                break
        family = str(settings.get("family", path.stem))
        preset = Preset(path.stem, settings, " ".join(comment_lines), reference_block(text))
        families.setdefault(family, []).append(preset)
    return families


@dataclass
class ClassMethod:
    """A method defined by one class (``class X(ScorerMethod, family="x")`` in ``kvbench/methods/<x>.py``), read with
    :mod:`ast`: its module docstring, its knobs (fields: name, default, ``#:`` comment) and its reference."""

    family: str
    module: str
    class_name: str
    doc: str
    knobs: list[tuple[str, str, str]]
    reference: str


def read_class_methods() -> dict[str, ClassMethod]:
    """Family -> the one-class method defining it, from ``kvbench/methods/*.py`` (nothing imported)."""
    found = {}
    for path in sorted((REPO / "kvbench" / "methods").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        for node in tree.body:
            keywords = {k.arg: k.value for k in node.keywords} if isinstance(node, ast.ClassDef) else {}
            family = keywords.get("family")
            if not (isinstance(family, ast.Constant) and isinstance(family.value, str)):
                continue
            reference = keywords.get("reference")
            lines = text.splitlines()
            knobs = []
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                    comment = []
                    for above in reversed(lines[: item.lineno - 1]):
                        if not above.strip().startswith("#:"):
                            break
                        comment.insert(0, above.strip().removeprefix("#:").strip())
                    default = ast.get_source_segment(text, item.value) or ""
                    knobs.append((item.target.id, default, " ".join(comment)))
            found[family.value] = ClassMethod(
                family.value,
                path.relative_to(REPO).as_posix(),
                node.name,
                ast.get_docstring(tree) or "",
                knobs,
                reference.value if isinstance(reference, ast.Constant) else "",
            )
    return found


def class_method_page(method: ClassMethod, tests: list[TestEvidence]) -> str:
    """The Markdown of ``methods/<family>.md`` for a one-class method."""
    family = method.family
    lines = [
        f"# Method `{family}`",
        "",
        f"Generated from `{method.module}` (class `{method.class_name}`) and `tests/methods/test_{family}.py` when "
        "the site is built: a method defined by one class, with no YAML (`method={family}` runs its default preset;"
        " [Add a method](add-a-method.md) shows how).",
        "",
        method.doc,
        "",
        f"Run it: `python run.py method={family} budget=0.5x`.",
        "",
        "Its own knobs (`method.params.<knob>`), besides those every one-class method has (`keep_window`, the "
        "wrappers `allocation`, `layers`, `selection` with `selection_length`, `rescale`, `decode_interval` with "
        "`decode_target`: "
        "[wrappers over any scorer](index.md#wrappers-over-any-scorer)):",
        "",
        "| knob | default | meaning |",
        "| --- | --- | --- |",
        *[f"| `{name}` | `{default}` | {_escape_pipes(comment)} |" for name, default, comment in method.knobs],
        "",
    ]
    if method.reference:
        lines += [f"Reference: `{method.reference}`.", ""]
    lines += evidence_lines(family, {family}, tests)
    return "\n".join(lines) + "\n"


def read_tests() -> list[TestEvidence]:
    """Every ``test_*`` function in ``tests/**/test_*.py`` with its docstring summary and parametrized strings."""
    tests = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                doc = (ast.get_docstring(node) or "").strip().split("\n\n")[0].replace("\n", " ")
                doc = doc or node.name.removeprefix("test_").replace("_", " ") + " (the test's name)"
                parameters = {
                    sub.value
                    for decorator in node.decorator_list
                    if _is_parametrize(decorator)
                    for sub in ast.walk(decorator)
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
                }
                tests.append(TestEvidence(path.relative_to(REPO / "tests").as_posix(), node.name, doc, parameters))
    return tests


def _is_parametrize(decorator: ast.expr) -> bool:
    """Whether ``decorator`` is ``@pytest.mark.parametrize(...)``."""
    return (
        isinstance(decorator, ast.Call)
        and isinstance(decorator.func, ast.Attribute)
        and decorator.func.attr == "parametrize"
    )


def family_test_file(family: str) -> str:
    """The test file of a family, relative to ``tests/``: its evidence on the family's page."""
    return f"methods/test_{family}.py"


def evidence_lines(family: str, preset_names: set[str], tests: list[TestEvidence]) -> list[str]:
    """The page's ``Parity evidence`` section: the tests of :func:`family_test_file` (names and docstring
    summaries), then the tests of the cross-family suites (:data:`CROSS_FAMILY_FOLDERS`) parametrized over one of
    ``preset_names``.  A family without its test file is a warning (an error under ``mkdocs build --strict``; the
    docs tests check it too)."""
    own_file = family_test_file(family)
    own = [test for test in tests if test.file == own_file]
    cross = [
        test
        for test in tests
        if test.file != own_file and test.file.split("/")[0] in CROSS_FAMILY_FOLDERS and preset_names & test.parameters
    ]
    lines = ["## Parity evidence", ""]
    if own:
        lines += [f"The tests of `tests/{own_file}`:", "", "| test | what it checks |", "| --- | --- |"]
        lines += [f"| `{test.name}` | {_escape_pipes(test.summary)} |" for test in own]
    else:
        LOG.warning("method family %r has no test file tests/%s (its page's evidence)", family, own_file)
        lines.append(f"No test file `tests/{own_file}`.")
    if cross:
        lines += [
            "",
            "Suites run over several families that run one of its presets:",
            "",
            "| test | what it checks |",
            "| --- | --- |",
        ]
        lines += [f"| `tests/{test.file}::{test.name}` | {_escape_pipes(test.summary)} |" for test in cross]
    return lines


def table_rows(markdown: str, header: str) -> list[str]:
    """The body rows of the Markdown table whose header line starts with ``header``."""
    lines = markdown.splitlines()
    for index, line in enumerate(lines):
        if line.startswith(header):
            rows = []
            for row in lines[index + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(row)
            return rows
    raise RuntimeError(f"{METHODS_PAGE} has no table starting {header!r}")


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def family_tables(family: str) -> list[str]:
    """The rows of the methods page's preset table (family column = ``family``) and switch table (naming it)."""
    markdown = (REPO / METHODS_PAGE).read_text(encoding="utf-8")
    presets = [row for row in table_rows(markdown, "| method | family |") if _cells(row)[1] == family]
    names = SWITCH_NAMES.get(family, ())
    switches = [row for row in table_rows(markdown, "| switch |") if any(name in _cells(row)[0] for name in names)]
    lines = []
    if presets:
        lines += ["| method | family | reproduces | what it does |", "| --- | --- | --- | --- |", *presets, ""]
    if switches:
        lines += [
            "kvbench's own variants of this family: named switches, off by default (`method.params.<key>` unless "
            "noted):",
            "",
            "| switch | default (reference) | kvbench variant |",
            "| --- | --- | --- |",
            *switches,
            "",
        ]
    return lines


def _escape_pipes(text: str) -> str:
    return text.replace("|", "\\|")


def _markdown_cell(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip() if not isinstance(value, str) else value
    text = text.removesuffix("\n...").strip()
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def family_page(family: str, presets: list[Preset], tests: list[TestEvidence]) -> str:
    """The Markdown of ``methods/<family>.md``."""
    lines = [
        f"# Method family `{family}`",
        "",
        f"Generated from `conf/method/*.yaml` (presets with `family: {family}`) and `tests/` when the site is built.",
        "The knobs shared by every family and the paper experiments' settings are on the [methods page](index.md).",
        "",
        *family_tables(family),
    ]
    for preset in presets:
        lines += [f"## `{preset.name}`", ""]
        if preset.comment:
            lines += [preset.comment, ""]
        lines += [f"Run it: `python run.py method={preset.name}`.", ""]
        shown = {key: value for key, value in preset.settings.items() if key not in HIDDEN_KEYS}
        if shown:
            lines += ["| setting | value |", "| --- | --- |"]
            for key, value in shown.items():
                if isinstance(value, dict):
                    lines += [f"| `{key}.{sub}` | {_markdown_cell(sub_value)} |" for sub, sub_value in value.items()]
                else:
                    lines.append(f"| `{key}` | {_markdown_cell(value)} |")
            lines.append("")
        if preset.reference_text:
            lines += [
                f"Reference (the `reference:` block of `conf/method/{preset.name}.yaml`, recorded in every "
                "`metrics.json`):",
                "",
                "```yaml",
                preset.reference_text,
                "```",
                "",
            ]
    lines += evidence_lines(family, {preset.name for preset in presets}, tests)
    return "\n".join(lines) + "\n"


def on_config(config: Any) -> Any:
    """Document the checkout that holds ``mkdocs.yml``, wherever ``mkdocs`` is started, put the version it documents
    in every page's footer, and put every method page the nav's ``Methods`` section does not list yet at its end
    (MkDocs hook): a new method needs no nav edit."""
    global REPO
    REPO = Path(config.config_file_path).resolve().parent
    config.copyright = f"This site documents kvbench {kvbench_version()}."
    for section in config["nav"] or []:
        if isinstance(section, dict) and isinstance(section.get("Methods"), list):
            listed = {page for entry in section["Methods"] for page in entry.values()}
            families = sorted(set(read_presets()) | set(read_class_methods()))
            section["Methods"] += [
                {family: f"methods/{family}.md"} for family in families if f"methods/{family}.md" not in listed
            ]
    return config


def on_files(files: Any, config: Any) -> Any:
    """Add ``methods/<family>.md`` for every method family: the YAML presets' families and the one-class methods
    (MkDocs hook)."""
    from mkdocs.structure.files import File

    tests = read_tests()
    presets = read_presets()
    for family, family_presets in presets.items():
        content = family_page(family, family_presets, tests)
        files.append(File.generated(config, f"methods/{family}.md", content=content))
    for family, method in read_class_methods().items():
        if family not in presets:
            content = class_method_page(method, tests)
            files.append(File.generated(config, f"methods/{family}.md", content=content))
    return files
