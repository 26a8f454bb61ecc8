"""Rebuild every paper table from our runs, next to the paper's printed numbers.

For each table in :data:`kvbench.reporting.paper_refs.TABLES` and each printed cell, :func:`compare_table` finds
our score (a dataset cell is the run's score on that dataset; an aggregate cell is computed by the paper's own
convention) and the difference ``ours - paper``.  Renderers keep the paper's layout (its rows and columns) and
write, per paper row, an ``ours`` line, a ``paper`` line and a ``Δ`` line; within each model × budget block the
best compressed method is bold and the second underlined, as the papers do (computed separately for our numbers
and for the paper's).  A cell we do not have is "–" and every such cell is listed in ``missing_runs``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvbench.reporting.conventions import MissingData
from kvbench.reporting.paper_refs import CELL_COLUMNS, DEFAULT_PAPER_DIR, TABLES, TableSpec, load_reference

DASH = "–"

#: Columns of a comparison frame.
COMPARISON_COLUMNS: tuple[str, ...] = (
    *CELL_COLUMNS,
    "kind",
    "paper",
    "ours",
    "diff",
    "tag",
    "missing",
    "paper_rank",
    "ours_rank",
    "note",
)


@dataclass
class RowRuns:
    """The runs found for one paper row: the tag used and ``dataset -> score``."""

    tag: str | None
    scores: dict[str, float]


def _select_runs(runs: pd.DataFrame, spec: TableSpec, first: pd.Series) -> RowRuns | None:
    """Scores of the run matching one paper row, trying the table's tags in order of preference."""
    if runs.empty or not first["method"]:
        return None
    sel = runs[
        (runs["model"] == first["model"])
        & (runs["task"] == first["task"])
        & (runs["method"] == first["method"])
        & (runs["budget"] == first["budget"])
    ]
    is_full = first["method"] == "full"
    if first["question_mode"] and not is_full:
        sel = sel[sel["question_mode"] == first["question_mode"]]
    for tag in spec.tags_for(first["method"]):
        hit = sel[sel["tag"].isna()] if tag is None else sel[sel["tag"] == tag]
        if is_full and first["question_mode"] and (hit["question_mode"] == first["question_mode"]).any():
            hit = hit[hit["question_mode"] == first["question_mode"]]  # prefer the table's mode when both exist
        if not hit.empty:
            hit = hit.drop_duplicates("dataset")
            return RowRuns(tag, dict(zip(hit["dataset"], hit["score"].astype(float), strict=True)))
    return None


def compare_table(spec: TableSpec, ref: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Paper cell by paper cell: the paper's value, ours, their difference and why ours may be missing."""
    out = []
    table_datasets = list(dict.fromkeys(ref.loc[ref["kind"] == "dataset", "dataset"]))
    for _, g in ref.groupby("row", sort=True):
        first = g.iloc[0]
        found = _select_runs(runs, spec, first) if spec.kind == "scores" else None
        for r in g.itertuples():
            ours, missing = math.nan, ""
            if spec.kind != "scores":
                missing = f"{spec.kind} table: not rebuilt from accuracy runs"
            elif not r.method:
                missing = "paper row has no recoverable method"
            elif found is None:
                missing = "no run"
            elif r.kind == "dataset":
                if r.dataset in found.scores and not math.isnan(found.scores[r.dataset]):
                    ours = found.scores[r.dataset]
                else:
                    missing = f"dataset not run: {r.dataset}"
            elif r.kind == "aggregate":
                try:
                    ours = spec.convention.aggregate(r.column, found.scores, table_datasets)
                except MissingData as err:
                    missing = "incomplete run, missing: " + ", ".join(err.missing)
            paper = r.value
            out.append(
                {
                    "table": spec.id,
                    "row": r.row,
                    "model": r.model,
                    "model_label": r.model_label,
                    "task": r.task,
                    "question_mode": r.question_mode,
                    "method": r.method,
                    "method_label": r.method_label,
                    "budget": r.budget,
                    "budget_label": r.budget_label,
                    "column": r.column,
                    "column_label": r.column_label,
                    "kind": r.kind,
                    "paper": paper,
                    "ours": ours,
                    "diff": ours - paper if not (math.isnan(ours) or pd.isna(paper)) else math.nan,
                    "tag": found.tag if found is not None else None,
                    "missing": missing,
                    "note": r.note,
                }
            )
    df = pd.DataFrame(out, columns=[c for c in COMPARISON_COLUMNS if c not in ("paper_rank", "ours_rank")])
    df["paper_rank"] = _ranks(df, "paper", spec)
    df["ours_rank"] = _ranks(df, "ours", spec)
    return df[list(COMPARISON_COLUMNS)]


def _ranks(df: pd.DataFrame, value: str, spec: TableSpec) -> pd.Series:
    """1 = best, 2 = second best among compressed methods of one model × budget block, per column (else 0)."""
    ranks = pd.Series(0, index=df.index, dtype=int)
    if spec.kind != "scores" or df.empty:
        return ranks
    comp = df[(df["method"] != "full") & (df["budget"] != "full") & df[value].notna()]
    for _, g in comp.groupby(["model", "budget", "question_mode", "column"], sort=False):
        if len(g) < 2:
            continue
        order = sorted(set(g[value].round(6)), reverse=True)
        for idx, v in g[value].round(6).items():
            if v == order[0]:
                ranks[idx] = 1
            elif len(order) > 1 and v == order[1]:
                ranks[idx] = 2
    return ranks


def missing_runs(comparisons: pd.DataFrame) -> pd.DataFrame:
    """One line per paper row whose runs are absent or incomplete (what to run to fill the table)."""
    miss = comparisons[(comparisons["missing"] != "") & comparisons["missing"].notna()]
    miss = miss[~miss["missing"].str.endswith("not rebuilt from accuracy runs")]
    if miss.empty:
        return pd.DataFrame(columns=["table", "model", "task", "question_mode", "method", "budget", "what"])
    rows = []
    keys = ["table", "row", "model", "task", "question_mode", "method", "budget"]
    for key, g in miss.groupby(keys, sort=False):
        reasons = list(dict.fromkeys(g["missing"]))
        datasets = [m.split(": ", 1)[1] for m in reasons if m.startswith("dataset not run")]
        other = [m for m in reasons if not m.startswith("dataset not run")]
        what = "; ".join(other + ([f"datasets not run: {', '.join(datasets)}"] if datasets else []))
        rows.append(dict(zip(keys, key, strict=True), what=what))
    return pd.DataFrame(rows).drop(columns="row").drop_duplicates().reset_index(drop=True)


# ----------------------------------------------------------------------------------------------------------- render
def _fmt(v: float, digits: int = 2) -> str:
    return DASH if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _fmt_diff(v: float, digits: int = 2) -> str:
    if v is None or math.isnan(v):
        return DASH
    text = f"{v:+.{digits}f}"
    return text[1:] if float(text) == 0 else text


def _mark(text: str, rank: int, fmt: str) -> str:
    if text == DASH or rank == 0:
        return text
    if fmt == "md":
        return f"**{text}**" if rank == 1 else f"<u>{text}</u>"
    return f"\\textbf{{{text}}}" if rank == 1 else f"\\underline{{{text}}}"


def _label_columns(cmp: pd.DataFrame) -> list[str]:
    """Row-label columns worth showing: the ones that vary within the table (method always)."""
    cols = [c for c in ("model_label", "question_mode", "budget_label") if cmp[c].nunique() > 1]
    return [*cols, "method_label"]


_LABEL_NAMES = {"model_label": "Model", "question_mode": "Question", "budget_label": "Budget", "method_label": "Method"}


def layout(cmp: pd.DataFrame, fmt: str = "md") -> tuple[list[str], list[list[str]]]:
    """Header and body rows (strings) in the paper's layout: per paper row an ours / paper / Δ line."""
    labels = _label_columns(cmp)
    cols = list(dict.fromkeys(cmp["column"]))
    col_labels = [cmp.loc[cmp["column"] == c, "column_label"].iloc[0] for c in cols]
    header = [_LABEL_NAMES[c] for c in labels] + ["", *col_labels]
    body = []
    for _, g in cmp.groupby("row", sort=True):
        cells = g.set_index("column")
        first = g.iloc[0]
        label_vals = [str(first[c]) for c in labels]
        for src in ("ours", "paper", "Δ"):
            line = [*label_vals] if src == "ours" else [""] * len(labels)
            line.append(src)
            for c in cols:
                if c not in cells.index:  # the paper prints nothing in this row and column
                    line.append("")
                    continue
                cell = cells.loc[c]
                if src == "Δ":
                    line.append(_fmt_diff(cell["diff"]))
                else:
                    line.append(_mark(_fmt(cell[src]), int(cell[f"{src}_rank"]), fmt))
            body.append(line)
    return header, body


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(spec: TableSpec, cmp: pd.DataFrame, missing: pd.DataFrame | None = None) -> str:
    """One table as Markdown: title, the ours / paper / Δ layout, notes on missing paper cells and runs."""
    header, body = layout(cmp, "md")
    lines = [f"## {spec.id}: {spec.paper}, {spec.title}", ""]
    covered = int(cmp["ours"].notna().sum())
    lines.append(
        f"Cells with our value: {covered}/{len(cmp)}; paper cells printed: {int(cmp['paper'].notna().sum())}/"
        f"{len(cmp)}. Runs used: tag {', '.join(sorted({str(t) for t in cmp['tag'].dropna()})) or DASH}. "
        f"Bold = best, underlined = second best among compressed methods (per model and budget)."
    )
    lines += ["", "| " + " | ".join(_md_escape(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in body]
    notes = cmp[(cmp["note"] != "") & cmp["note"].notna()]
    if not notes.empty:
        lines += ["", "Paper cells with notes (missing = garbled or unrecoverable in the source, never guessed):", ""]
        for note, ng in notes.groupby("note", sort=False):
            where = [f"{n.model_label} {n.budget_label} {n.method_label} / {n.column_label}" for n in ng.itertuples()]
            lines.append(f"- {note} ({len(where)} cell{'s' if len(where) > 1 else ''}: {'; '.join(where)})")
    if missing is not None and not missing.empty:
        lines += [
            "",
            f"Missing runs (shown as –; `python run.py -m +experiment={spec.id}` runs this table's grid):",
            "",
        ]
        for m in missing.itertuples():
            lines.append(f"- {m.model} / {m.task} / {m.method} / {m.budget} ({m.question_mode or 'any'}): {m.what}")
    if spec.kind != "scores":
        lines += ["", f"This is a {spec.kind} table; it is shown for reference and not rebuilt from accuracy runs."]
    return "\n".join(lines) + "\n"


def _tex_escape(text: str) -> str:
    """Escape a label for LaTeX (numbers are formatted separately and need no escaping)."""
    for a, b in (("\\", "\\textbackslash{}"), ("&", "\\&"), ("%", "\\%"), ("_", "\\_"), ("#", "\\#")):
        text = text.replace(a, b)
    return _tex_cell(text)


def _tex_cell(text: str) -> str:
    return text.replace(DASH, "--").replace("Δ", "$\\Delta$").replace("—", "--").replace("±", "$\\pm$")


def render_latex(spec: TableSpec, cmp: pd.DataFrame) -> str:
    """One table as a LaTeX ``tabular`` (booktabs), same layout as the Markdown."""
    header, body = layout(cmp, "tex")
    n_label = len(header) - len(list(dict.fromkeys(cmp["column"]))) - 1
    align = "l" * (n_label + 1) + "r" * (len(header) - n_label - 1)
    lines = [
        f"% {spec.id}: {spec.paper}, {spec.title}",
        "\\begin{tabular}{" + align + "}",
        "\\toprule",
        " & ".join(_tex_escape(h) for h in header) + " \\\\",
        "\\midrule",
    ]
    for i, row in enumerate(body):
        cells = [_tex_escape(c) for c in row[: n_label + 1]] + [_tex_cell(c) for c in row[n_label + 1 :]]
        lines.append(" & ".join(cells) + " \\\\")
        if i % 3 == 2 and i != len(body) - 1:
            lines.append("\\midrule")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------------- all
def build_all(
    runs: pd.DataFrame, paper_dir: str | Path = DEFAULT_PAPER_DIR, tables: Iterable[str] | None = None
) -> dict[str, pd.DataFrame]:
    """Comparison frame of every table (``tables`` = a subset of ids)."""
    ids = list(tables) if tables is not None else list(TABLES)
    return {t: compare_table(TABLES[t], load_reference(t, paper_dir), runs) for t in ids}


def write_tables(
    comparisons: dict[str, pd.DataFrame], out_dir: str | Path, formats: Sequence[str] = ("md", "csv", "tex")
) -> pd.DataFrame:
    """Write ``<out>/<table>.{md,csv,tex}``, ``missing_runs.{csv,md}`` and ``index.md``; returns the missing list."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    all_missing = []
    index = [
        "# Paper tables rebuilt from our runs",
        "",
        "| table | paper | title | cells with ours | mean abs. Δ | missing runs |",
        "|---|---|---|---|---|---|",
    ]
    for tid, cmp in comparisons.items():
        spec = TABLES[tid]
        miss = missing_runs(cmp)
        all_missing.append(miss)
        if "md" in formats:
            (out / f"{tid}.md").write_text(render_markdown(spec, cmp, miss), encoding="utf-8")
        if "csv" in formats:
            cmp.to_csv(out / f"{tid}.csv", index=False)
        if "tex" in formats:
            (out / f"{tid}.tex").write_text(render_latex(spec, cmp), encoding="utf-8")
        mad = cmp["diff"].abs().mean()
        index.append(
            f"| [{tid}]({tid}.md) | {spec.paper} | {spec.title} | {int(cmp['ours'].notna().sum())}/{len(cmp)} | "
            f"{_fmt(mad)} | {len(miss)} |"
        )
    missing = pd.concat(all_missing, ignore_index=True) if all_missing else pd.DataFrame()
    missing.to_csv(out / "missing_runs.csv", index=False)
    md = ["# Missing runs", "", "Every paper cell we cannot fill, grouped by run.", ""]
    md += [
        f"- {m.table}: {m.model} / {m.task} / {m.method} / {m.budget} ({m.question_mode or 'any'}): {m.what}"
        for m in missing.itertuples()
    ]
    (out / "missing_runs.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    index += ["", f"{len(missing)} missing runs in total: see [missing_runs.md](missing_runs.md)."]
    (out / "index.md").write_text("\n".join(index) + "\n", encoding="utf-8")
    return missing


def write_runs_overview(runs: pd.DataFrame, out_dir: str | Path) -> None:
    """``runs.csv`` (tidy, every dataset of every run) and ``runs_summary.{csv,md}`` (one row per run)."""
    from kvbench.reporting.aggregate import run_summary

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / "runs.csv", index=False)
    summary = run_summary(runs)
    summary.to_csv(out / "runs_summary.csv", index=False)
    lines = ["# All runs", ""]
    if summary.empty:
        lines.append("No runs found.")
    else:
        header = [str(c) for c in summary.columns]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for rec in summary.itertuples(index=False):
            cells = [_fmt(v) if isinstance(v, float) else str(v) for v in rec]
            lines.append("| " + " | ".join(_md_escape(c) for c in cells) + " |")
    (out / "runs_summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
