"""Print a comparison frame (:func:`kvbench.reporting.tables.compare_table`) as Markdown and LaTeX, in the paper's
layout.

* One paper row gives three lines: ``kvbench`` (our runs, with the column's precision), ``paper`` (the cell exactly
  as printed, ``28.3 ± 0.2`` included) and ``Δ`` (kvbench − paper).  A row that can never be measured (a
  reference-only table, or a paper row whose method is unrecoverable) gives its ``paper`` line only, and a
  reference-only table has no ours / paper column at all.
* ``–`` = no run of ours; ``?`` = the paper's cell is not printed or illegible (see the notes); the paper's own
  marks (its ``-``) are kept.  Bold / underlined = best / second-best compressed method per model and budget.
* Blocks: the rows sharing model, question mode and budget (the full-cache rows of a model go with each of its
  budget blocks).  A table longer than :data:`MAX_LINES` lines with several blocks is printed as one sub-table
  (Markdown) or one float (LaTeX) per block, as the papers separate them; a shorter one stays whole.
* LaTeX: a complete ``table`` float (an unnumbered ``caption*``: the paper's own table number is the only one;
  label, ``booktabs`` rules), shrunk to ``\\linewidth`` only when wider, pure ASCII; it needs
  ``\\usepackage{booktabs,graphicx,amssymb,caption}`` (see :func:`latex_document`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvbench.reporting.cells import (
    NOT_PRINTED,
    NOT_RUN,
    column_decimals,
    format_diff,
    format_number,
    tex_escape,
)
from kvbench.reporting.paper_refs import TABLES, TableSpec

#: Longest table (body lines) printed in one piece; longer ones with several blocks are split per block.
MAX_LINES = 24
#: LaTeX packages the generated floats use.
LATEX_PACKAGES = ("booktabs", "graphicx", "amssymb", "caption")

_LABEL_NAMES = {"model_label": "Model", "question_mode": "Question", "budget_label": "Budget"}
_BLOCK_KEY = ("model_label", "question_mode", "budget_label")

#: The label of our line in each paper row: never "ours", which a paper's own method label (XKV's "XKV(Ours)") uses.
OURS = "kvbench"

LEGEND = (
    "kvbench = our runs; paper = as printed; Δ = kvbench − paper. "
    f"{NOT_RUN} = not run by us (see Missing runs); {NOT_PRINTED} = not printed or illegible in the paper "
    "(see the notes). Bold / underlined = best / second best compressed method per model and budget "
    "(kvbench's and the paper's ranked separately)."
)


@dataclass(frozen=True)
class Block:
    """Consecutive paper rows printed together: their shared labels (``title``) and row numbers."""

    title: str
    slug: str
    rows: tuple[int, ...]


def measurable(spec: TableSpec, method: str) -> bool:
    """Whether a paper row can ever get a value of ours (a scores table and a recoverable method)."""
    return spec.kind == "scores" and bool(method)


def table_blocks(cmp: pd.DataFrame, attach_full: bool = True) -> list[Block]:
    """The table's model × question mode × budget blocks, in paper order.

    ``attach_full``: the full-cache rows of a model join every budget block of that model (for blocks printed one
    by one); otherwise (and for a model with only full-cache rows) they stay a block of their own.
    """
    firsts = cmp.drop_duplicates("row").sort_values("row")
    groups: dict[tuple[str, ...], list[int]] = {}
    methods = dict(zip(firsts["row"], firsts["method"], strict=True))
    for rec in firsts.itertuples():
        groups.setdefault(tuple(str(getattr(rec, c)) for c in _BLOCK_KEY), []).append(int(rec.row))
    full_only = {k for k, rows in groups.items() if all(methods[r] == "full" for r in rows)} if attach_full else set()
    varying_mode = firsts["question_mode"].nunique() > 1
    blocks = []
    for key, rows in groups.items():
        model, mode, budget = key
        same_model = [k for k in groups if k[:2] == (model, mode)]
        if key in full_only and any(k not in full_only for k in same_model):
            continue  # printed with each budget block of this model
        full_rows = [] if key in full_only else [r for k in same_model if k in full_only for r in groups[k]]
        title = " · ".join(p for p in (model, mode if varying_mode else "", budget) if p)
        slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "all"
        blocks.append(Block(title, slug, tuple(full_rows + rows)))
    return blocks


def _line_count(spec: TableSpec, cmp: pd.DataFrame, rows: Sequence[int]) -> int:
    methods = dict(zip(cmp["row"], cmp["method"], strict=False))
    return sum(3 if measurable(spec, methods[r]) else 1 for r in rows)


def split_blocks(spec: TableSpec, cmp: pd.DataFrame) -> list[Block] | None:
    """The blocks to print one by one, or ``None`` when the table is printed whole."""
    blocks = table_blocks(cmp)
    rows = list(dict.fromkeys(cmp.sort_values("row")["row"]))
    if len(blocks) > 1 and _line_count(spec, cmp, rows) > MAX_LINES:
        return blocks
    return None


def print_units(spec: TableSpec, cmp: pd.DataFrame) -> list[list[Block]]:
    """What is printed as one table: each block alone (split), or all blocks in paper order together."""
    blocks = split_blocks(spec, cmp)
    return [[b] for b in blocks] if blocks is not None else [table_blocks(cmp, attach_full=False)]


@dataclass
class Grid:
    """A table ready to print: header, body lines and the line indices where a paper row / a block starts."""

    header: list[str]
    lines: list[list[str]]
    numeric_from: int
    row_starts: list[int]
    block_starts: list[int]


@dataclass
class TableCells:
    """A comparison frame as plain lookups: per row its cells by column, the columns, and each column's precision."""

    rows: dict[int, dict[str, dict]]
    columns: list[str]
    column_labels: list[str]
    decimals: dict[str, int]

    @classmethod
    def of(cls, cmp: pd.DataFrame) -> TableCells:
        """Index ``cmp`` once (rendering looks up every cell several times)."""
        rows: dict[int, dict[str, dict]] = {}
        for rec in cmp.to_dict("records"):
            rows.setdefault(int(rec["row"]), {})[str(rec["column"])] = rec
        columns = list(dict.fromkeys(cmp["column"]))
        labels = dict(zip(cmp["column"], cmp["column_label"], strict=True))
        decimals = {c: column_decimals(g) for c, g in cmp.groupby("column", sort=False)["printed"]}
        return cls(rows, columns, [str(labels[c]) for c in columns], decimals)


def layout(
    spec: TableSpec,
    cells: TableCells,
    blocks: Sequence[Block],
    escape: Callable[[str], str],
    mark: Callable[[str, int], str],
) -> Grid:
    """Lines of the given blocks: labels that vary within them, a source column for scores tables, the cells."""
    firsts = [next(iter(cells.rows[r].values())) for b in blocks for r in b.rows]
    compressed = [f for f in firsts if f["method"] != "full"] or firsts  # "Full" is no budget to show
    varying = [c for c in _LABEL_NAMES if len({str(f[c]) for f in compressed}) > 1]
    with_source = spec.kind == "scores"
    header = [_LABEL_NAMES[c] for c in varying] + [spec.row_header] + ([""] if with_source else [])
    header = [escape(h) for h in header + cells.column_labels]
    grid = Grid(header, [], len(header) - len(cells.columns), [], [])
    for block in blocks:
        grid.block_starts.append(len(grid.lines))
        for row in block.rows:
            row_cells = cells.rows[row]
            first = next(iter(row_cells.values()))
            labels = [escape(str(first[c])) for c in [*varying, "method_label"]]
            sources = (OURS, "paper", "Δ") if measurable(spec, first["method"]) else ("paper",)
            grid.row_starts.append(len(grid.lines))
            for i, src in enumerate(sources):
                line = (labels if i == 0 else [""] * len(labels)) + ([escape(src)] if with_source else [])
                for c in cells.columns:
                    cell = row_cells.get(c)
                    line.append("" if cell is None else _cell(cell, src, cells.decimals[c], escape, mark))
                grid.lines.append(line)
    return grid


def _cell(cell: dict, src: str, decimals: int, escape: Callable[[str], str], mark: Callable[[str, int], str]) -> str:
    """One cell's text: ours (column precision, rank mark), the paper's as printed, or the difference."""
    if src == "Δ":
        return escape(format_diff(cell["diff"], decimals))
    if src == OURS:
        text = format_number(cell["ours"], decimals)
        return mark(escape(text), int(cell["ours_rank"])) if text != NOT_RUN else escape(text)
    printed = str(cell["printed"]).strip()
    if not printed:
        return escape(NOT_PRINTED)
    return mark(escape(printed), int(cell["paper_rank"])) if not pd.isna(cell["paper"]) else escape(printed)


# --------------------------------------------------------------------------------------------------------- Markdown
def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def _md_mark(text: str, rank: int) -> str:
    return f"**{text}**" if rank == 1 else f"<u>{text}</u>" if rank == 2 else text


def _md_grid(grid: Grid) -> list[str]:
    align = ["---"] * grid.numeric_from + ["--:"] * (len(grid.header) - grid.numeric_from)
    lines = ["| " + " | ".join(grid.header) + " |", "|" + "|".join(align) + "|"]
    return lines + ["| " + " | ".join(line) + " |" for line in grid.lines]


def render_markdown(spec: TableSpec, cmp: pd.DataFrame, missing: pd.DataFrame | None = None) -> str:
    """One table as Markdown: title, the table (or one sub-table per block), legend, notes and missing runs."""
    lines = [f"## {spec.paper}, {spec.title} (`{spec.id}`)", ""]
    if spec.kind == "scores":
        tags = ", ".join(sorted({str(t) for t in cmp["tag"].dropna()})) or NOT_RUN
        lines.append(
            f"Cells with our value: {int(cmp['ours'].notna().sum())}/{len(cmp)}; paper cells printed: "
            f"{int((cmp['printed'].astype(str).str.strip() != '').sum())}/{len(cmp)}. Runs used: tag {tags}."
        )
    else:
        lines.append(f"Reference only ({spec.kind} table): the paper's numbers, not rebuilt from accuracy runs.")
    if bool(cmp["synthetic"].any()):
        lines += ["", "**Synthetic runs** (paper values plus noise, made by `kvbench.reporting.synthetic`): these "
                  "'ours' numbers are not measurements."]  # fmt: skip
    flagged = cmp[(cmp["flags"].astype(str) != "") & cmp["ours"].notna()] if "flags" in cmp else cmp.iloc[:0]
    if not flagged.empty:  # ranked here like the others: said so (kvbench.reporting.aggregate's flags)
        rows = sorted({f"{r.model} {r.method} {r.budget} ({r.flags})" for r in flagged.itertuples()})
        lines += ["", f"**Flagged runs** (their 'ours' cells need a look): {'; '.join(rows)}."]
    units, cells = print_units(spec, cmp), TableCells.of(cmp)
    for unit in units:
        if len(units) > 1:
            lines += ["", f"### {unit[0].title}"]
        lines += ["", *_md_grid(layout(spec, cells, unit, _md_escape, _md_mark))]
    lines += ["", LEGEND if spec.kind == "scores" else f"{NOT_PRINTED} = not printed or illegible in the paper."]
    notes = cmp[(cmp["note"] != "") & cmp["note"].notna()]
    if not notes.empty:
        lines += ["", "Paper cells with notes:", ""]
        for note, ng in notes.groupby("note", sort=False):
            where = [
                " ".join(p for p in (n.model_label, n.budget_label, n.method_label) if p) + f" / {n.column_label}"
                for n in ng.itertuples()
            ]
            lines.append(f"- {note} ({len(where)} cell{'s' if len(where) > 1 else ''}: {'; '.join(where)})")
    if missing is not None and not missing.empty:
        lines += ["", f"Missing runs (`python run.py -m +experiment={spec.id}` runs this table's grid):", ""]
        for m in missing.itertuples():
            lines.append(
                f"- {m.model} / {m.task} / {m.method} / {m.budget} ({m.question_mode or 'any'}): {m.what}; "
                f"run: `{m.command}`"
            )
    return "\n".join(lines) + "\n"


def runs_overview_markdown(summary: pd.DataFrame) -> str:
    """``runs_summary.md``: one row per run, scores with two decimals."""
    lines = ["# All runs", ""]
    if summary.empty:
        return "\n".join([*lines, "No runs found."]) + "\n"
    header = [str(c) for c in summary.columns]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for rec in summary.itertuples(index=False):
        cells = [format_number(v, 2) if isinstance(v, float) else str(v) for v in rec]
        lines.append("| " + " | ".join(_md_escape(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------------ LaTeX
_NEGATIVE_RE = re.compile(r"^-(?=\d)")


def _tex_text(text: str) -> str:
    """:func:`tex_escape`, with a leading minus of a number set as a math minus (``$-$1.22``, not a hyphen)."""
    return tex_escape(_NEGATIVE_RE.sub("−", str(text)))


def _tex_mark(text: str, rank: int) -> str:
    return f"\\textbf{{{text}}}" if rank == 1 else f"\\underline{{{text}}}" if rank == 2 else text


def _tex_float(spec: TableSpec, grid: Grid, caption: str, label: str) -> list[str]:
    align = "l" * grid.numeric_from + "r" * (len(grid.header) - grid.numeric_from)
    body = []
    for i, line in enumerate(grid.lines):
        if i in grid.block_starts and i > 0:
            body.append("\\midrule")
        elif i in grid.row_starts and i > 0 and spec.kind == "scores":
            body.append("\\addlinespace[2pt]")
        body.append(" & ".join(line) + " \\\\")
    return [
        "\\begin{table}[htbp]",
        "\\centering",
        "\\setlength{\\tabcolsep}{3pt}",
        # caption*: no number of LaTeX's own beside the paper's ("CAKE, Table 5", not "Table 48: CAKE, Table 5").
        f"\\caption*{{{caption}}}",
        f"\\label{{{label}}}",
        "\\smallskip",
        # Shrink to the text width only when wider (graphicx evaluates \width as the natural width).
        "\\resizebox{\\ifdim\\width>\\linewidth\\linewidth\\else\\width\\fi}{!}{%",
        f"\\begin{{tabular}}{{{align}}}",
        "\\toprule",
        " & ".join(grid.header) + " \\\\",
        "\\midrule",
        *body,
        "\\bottomrule",
        "\\end{tabular}}",
        "\\end{table}",
    ]


def render_latex(spec: TableSpec, cmp: pd.DataFrame) -> str:
    """One table as LaTeX ``table`` floats (one per block when split), same layout as the Markdown."""
    legend = (
        "kvbench: our runs; paper: as printed; $\\Delta$ = kvbench $-$ paper; -- = not run; ? = not printed or "
        "illegible in the paper. Bold/underlined: best/second best compressed method per model and budget."
        if spec.kind == "scores"
        else "Reference only: the paper's numbers. ? = not printed or illegible in the paper."
    )
    if bool(cmp["synthetic"].any()):
        legend += " SYNTHETIC runs (paper values plus noise), not measurements."
    base = tex_escape(f"{spec.paper}, {spec.title}")
    lines = [f"% {spec.id}: {tex_escape(spec.paper)}, {tex_escape(spec.title)} (written by kvbench scripts/tables.py)"]
    lines.append("% needs \\usepackage{" + ",".join(LATEX_PACKAGES) + "}")
    units, cells = print_units(spec, cmp), TableCells.of(cmp)
    for i, unit in enumerate(units):
        grid = layout(spec, cells, unit, _tex_text, _tex_mark)
        if len(units) == 1:
            lines += _tex_float(spec, grid, f"{base}. {legend}", f"tab:{spec.id}")
        else:
            caption = f"{base} ({i + 1}/{len(units)}: {tex_escape(unit[0].title)}). {legend}"
            lines += _tex_float(spec, grid, caption, f"tab:{spec.id}:{unit[0].slug}")
    return "\n".join(lines) + "\n"


def latex_document(table_ids: Sequence[str]) -> str:
    """A standalone document that ``\\input``s every ``<id>.tex`` (``make tables-pdf`` compiles it)."""
    lines = [
        "% Every rebuilt paper table in one document (written by kvbench scripts/tables.py; make tables-pdf).",
        "\\documentclass[10pt]{article}",
        "\\usepackage[margin=2cm]{geometry}",
        "\\usepackage{" + ",".join(LATEX_PACKAGES) + "}",
        "\\begin{document}",
        "\\tableofcontents",
    ]
    for tid in table_ids:
        spec = TABLES.get(tid)
        title = f"{spec.paper}, {spec.title}" if spec is not None else tid
        lines += ["\\clearpage", f"% {tid}", f"\\section*{{{tex_escape(title)}}}"]
        lines += [f"\\addcontentsline{{toc}}{{section}}{{{tex_escape(title)}}}", f"\\input{{{tid}.tex}}"]
    lines.append("\\end{document}")
    return "\n".join(lines) + "\n"


class LatexError(RuntimeError):
    """pdflatex is missing or failed; the message names the fix or the log lines around the first error."""


def compile_pdf(tex_path: str | Path, engine: str = "pdflatex", timeout_s: float = 300.0) -> Path:
    """Compile ``tex_path`` in its own folder (twice, for the table of contents); returns the PDF's path."""
    tex_path = Path(tex_path)
    if shutil.which(engine) is None:
        raise LatexError(
            f"{engine} not found: install a LaTeX engine with booktabs, graphicx, amssymb and caption "
            "(Debian/Ubuntu: make setup-latex, i.e. apt-get install texlive-latex-base texlive-latex-recommended)"
        )
    command = [engine, "-interaction=nonstopmode", "-halt-on-error", tex_path.name]
    for _ in range(2):
        result = subprocess.run(
            command, cwd=tex_path.parent, capture_output=True, text=True, errors="replace", timeout=timeout_s
        )
        if result.returncode != 0:
            log = result.stdout.splitlines()
            first = next((i for i, line in enumerate(log) if line.startswith("!")), max(len(log) - 20, 0))
            excerpt = "\n".join(log[max(first - 5, 0) : first + 15])
            raise LatexError(f"{engine} failed on {tex_path} (exit {result.returncode}):\n{excerpt}")
    return tex_path.with_suffix(".pdf")
