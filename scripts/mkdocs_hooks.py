"""MkDocs hooks for kvbench's documentation site (``mkdocs.yml``: ``hooks: [scripts/mkdocs_hooks.py]``).

Two things are generated at build time, so they cannot drift from the code:

* the kvbench version the site documents (``kvbench/version.py``'s ``__version__``), once, in the footer of every
  page (``copyright``), not in each page's text;
* one page per method family, ``methods/<family>.md``, from ``conf/method/*.yaml``: for each preset its header
  comment, its settings, its ``reference:`` block (repo, commit, file, what it reproduces) and the parity evidence
  (the tests that check the family or name the preset, found by reading ``tests/*.py`` with :mod:`ast`);
* one page per one-class method (``kvbench/methods/<family>.py``, read with :mod:`ast`): its docstring, knobs,
  reference and the tests of ``tests/methods/test_<family>.py``;
* the nav's ``Methods`` section gains every method page it does not list (a new method needs no nav edit).

The module reads files only (no kvbench import), so ``mkdocs build`` works without torch.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: The checkout being documented: the folder of ``mkdocs.yml`` (set by :func:`on_config`).
REPO = Path.cwd()

#: Family -> words a test's name may contain to be evidence for it (besides the family's own name).
FAMILY_KEYWORDS: dict[str, tuple[str, ...]] = {
    "full": ("full_cache", "nothing_evicted", "no_eviction"),
    "streamingllm": ("streaming",),
    "pyramidkv": ("pyramid",),
    "ada_snapkv": ("ada_", "adakv"),
    "ada_pyramidkv": ("ada_pyramid", "adakv"),
}
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
#: Test files (relative to ``tests/``) whose tests count as evidence for every preset they name as a string literal.
PARITY_FILES = (
    "parity/test_reference_parity.py",
    "parity/test_decode_parity.py",
    "methods/test_score_dtype.py",
    "methods/test_baselines.py",
    "methods/test_streamingllm.py",
    "methods/test_snapkv.py",
    "end_to_end/test_methods_end_to_end.py",
    "methods/test_fused_scoring.py",
    "inference/test_prefill.py",
    "cache/test_paged.py",
    "models/test_device_map.py",
)
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
    """A test function: ``tests/<file>::<name>`` and the first sentence of its docstring."""

    file: str
    name: str
    summary: str
    literals: set[str] = field(default_factory=set)


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
    evidence = [test for test in tests if test.file == f"methods/test_{family}.py"]
    lines += ["## Parity evidence", ""]
    if evidence:
        lines += [f"Tests in `tests/methods/test_{family}.py`:", "", "| test | what it checks |", "| --- | --- |"]
        lines += [f"| `tests/{test.file}::{test.name}` | {_escape_pipes(test.summary)} |" for test in evidence]
    else:
        lines.append(f"No test file `tests/methods/test_{family}.py`.")
    return "\n".join(lines) + "\n"


def read_tests() -> list[TestEvidence]:
    """Every ``test_*`` function in ``tests/**/test_*.py`` with its docstring summary and string literals."""
    tests = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                doc = (ast.get_docstring(node) or "").strip().split("\n\n")[0].replace("\n", " ")
                doc = doc or node.name.removeprefix("test_").replace("_", " ") + " (the test's name)"
                literals = {
                    sub.value
                    for part in [*node.decorator_list, node]
                    for sub in ast.walk(part)
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
                }
                tests.append(TestEvidence(path.relative_to(REPO / "tests").as_posix(), node.name, doc, literals))
    return tests


def evidence_for(family: str, presets: list[Preset], tests: list[TestEvidence]) -> list[TestEvidence]:
    """Tests named after the family, every test in ``tests/methods/test_<family>.py``, and parity tests naming a
    preset."""
    words = (family, *FAMILY_KEYWORDS.get(family, ()))
    names = {preset.name for preset in presets}
    found = []
    for test in tests:
        by_name = any(word in test.name for word in words) or Path(test.file).name == f"test_{family}.py"
        by_literal = test.file in PARITY_FILES and bool(names & test.literals)
        if by_name or by_literal:
            found.append(test)
    return found


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
    evidence = evidence_for(family, presets, tests)
    lines += ["## Parity evidence", ""]
    if evidence:
        lines += [
            "Tests that check this family (named after it, in its own test file, or parity tests running one of "
            "its presets):",
            "",
            "| test | what it checks |",
            "| --- | --- |",
        ]
        lines += [f"| `tests/{test.file}::{test.name}` | {_escape_pipes(test.summary)} |" for test in evidence]
    else:
        lines.append("No test names this family.")
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
