"""Rebuild every paper table from our runs, next to the paper's printed numbers.

For each table in :data:`kvbench.reporting.paper_refs.TABLES` and each printed cell, :func:`compare_table` finds
our score (a dataset cell is the run's score on that dataset; an aggregate cell is computed by the paper's own
convention) and the difference ``ours - paper``; :func:`missing_runs` lists every paper row we cannot fill and
:func:`write_tables` writes every table in the paper's layout (:mod:`kvbench.reporting.render`).  Within each
model × budget block the best compressed method is ranked 1 and the second 2, as the papers mark them in bold and
underline (computed separately for our numbers and for the paper's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvbench.reporting.aggregate import union_flags
from kvbench.reporting.paper_refs import CELL_COLUMNS, DEFAULT_PAPER_DIR, TABLES, TableSpec, load_reference
from kvbench.reporting.render import latex_document, render_latex, render_markdown, runs_overview_markdown
from kvbench.views.conventions import MissingData

#: Columns of a comparison frame.
COMPARISON_COLUMNS: tuple[str, ...] = (
    *CELL_COLUMNS,
    "kind",
    "paper",
    "printed",
    "ours",
    "diff",
    "tag",
    "synthetic",
    "missing",
    "paper_rank",
    "ours_rank",
    "note",
    "flags",
)


@dataclass
class RowRuns:
    """The runs found for one paper row: the tag used, ``dataset -> score`` and whether any run is synthetic."""

    tag: str | None
    scores: dict[str, float]
    synthetic: bool = False
    #: The runs' flags (:func:`kvbench.reporting.aggregate.load_runs`: incomplete, disagrees, mixed-code, stale-rows).
    flags: str = ""


_RUN_GROUP = ["model", "task", "method", "budget"]


def _runs_by_cell(runs: pd.DataFrame) -> dict[tuple[str, ...], pd.DataFrame]:
    """The runs grouped by model, task, method and budget (looked up once per paper row)."""
    if runs.empty:
        return {}
    return {tuple(str(k) for k in key): g for key, g in runs.groupby(_RUN_GROUP, sort=False)}


def _select_runs(by_cell: dict[tuple[str, ...], pd.DataFrame], spec: TableSpec, first: pd.Series) -> RowRuns | None:
    """Scores of the run matching one paper row, trying the table's tags in order of preference."""
    if not first["method"]:
        return None
    sel = by_cell.get(tuple(str(first[k]) for k in _RUN_GROUP))
    if sel is None:
        return None
    is_full = first["method"] == "full"
    if first["question_mode"] and not is_full:
        sel = sel[sel["question_mode"] == first["question_mode"]]
    for tag in spec.tags_for(first["method"]):
        hit = sel[sel["tag"].isna()] if tag is None else sel[sel["tag"] == tag]
        if is_full and first["question_mode"] and (hit["question_mode"] == first["question_mode"]).any():
            hit = hit[hit["question_mode"] == first["question_mode"]]  # prefer the table's mode when both exist
        if not hit.empty:
            hit = hit.drop_duplicates("dataset")
            synthetic = bool(hit["synthetic"].astype(bool).any()) if "synthetic" in hit else False
            flags = union_flags(hit.get("flags", []))
            return RowRuns(tag, dict(zip(hit["dataset"], hit["score"].astype(float), strict=True)), synthetic, flags)
    return None


def compare_table(spec: TableSpec, ref: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Paper cell by paper cell: the paper's value, ours, their difference and why ours may be missing."""
    if "printed" not in ref.columns:  # a hand-made reference: print its values as they are
        ref = ref.assign(printed=["" if pd.isna(v) else str(v) for v in ref["value"]])
    out = []
    table_datasets = list(dict.fromkeys(ref.loc[ref["kind"] == "dataset", "dataset"]))
    by_cell = _runs_by_cell(runs) if spec.kind == "scores" else {}
    rows: dict[int, list[dict]] = {}
    for rec in ref.to_dict("records"):  # plain dicts: far faster than row-wise pandas access
        rows.setdefault(int(rec["row"]), []).append(rec)
    for row in sorted(rows):
        cells = rows[row]
        found = _select_runs(by_cell, spec, cells[0]) if spec.kind == "scores" else None
        for r in cells:
            ours, missing = math.nan, ""
            if spec.kind != "scores":
                missing = f"{spec.kind} table: not rebuilt from accuracy runs"
            elif not r["method"]:
                missing = "paper row has no recoverable method"
            elif found is None:
                missing = "no run"
            elif r["kind"] == "dataset":
                if r["dataset"] in found.scores and not math.isnan(found.scores[r["dataset"]]):
                    ours = found.scores[r["dataset"]]
                else:
                    missing = f"dataset not run: {r['dataset']}"
            elif r["kind"] == "aggregate":
                try:
                    ours = spec.convention.aggregate(r["column"], found.scores, table_datasets)
                except MissingData as err:
                    missing = "incomplete run, missing: " + ", ".join(err.missing)
            paper = r["value"]
            out.append(
                {
                    **{c: r[c] for c in CELL_COLUMNS if c != "table"},
                    "table": spec.id,
                    "kind": r["kind"],
                    "paper": paper,
                    "printed": r["printed"],
                    "ours": ours,
                    "diff": ours - paper if not (math.isnan(ours) or pd.isna(paper)) else math.nan,
                    "tag": found.tag if found is not None else None,
                    "synthetic": found is not None and found.synthetic and not math.isnan(ours),
                    "missing": missing,
                    "note": r["note"],
                    "flags": found.flags if found is not None else "",
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
    if comp.empty:
        return ranks
    groups = (
        comp[value].astype(float).round(6).groupby([comp[k] for k in ("model", "budget", "question_mode", "column")])
    )
    dense = groups.rank(method="dense", ascending=False)  # ties share a rank; the next value is 2
    alone = groups.transform("size") < 2  # a lone method is not "best"
    ranks.loc[comp.index] = dense.where((dense <= 2) & ~alone, 0).astype(int)
    return ranks


def missing_runs(comparisons: pd.DataFrame) -> pd.DataFrame:
    """One line per paper row whose runs are absent or incomplete (what to run to fill the table)."""
    miss = comparisons[(comparisons["missing"] != "") & comparisons["missing"].notna()]
    # Reference-only tables and paper rows whose method is unrecoverable can never be run: not "missing".
    miss = miss[~miss["missing"].str.endswith("not rebuilt from accuracy runs") & (miss["method"] != "")]
    if miss.empty:
        return pd.DataFrame(columns=["table", "model", "task", "question_mode", "method", "budget", "what", "command"])
    rows = []
    keys = ["table", "row", "model", "task", "question_mode", "method", "budget"]
    for key, g in miss.groupby(keys, sort=False):
        reasons = list(dict.fromkeys(g["missing"]))
        datasets = [m.split(": ", 1)[1] for m in reasons if m.startswith("dataset not run")]
        other = [m for m in reasons if not m.startswith("dataset not run")]
        what = "; ".join(other + ([f"datasets not run: {', '.join(datasets)}"] if datasets else []))
        row = dict(zip(keys, key, strict=True), what=what)
        rows.append({**row, "command": run_command(TABLES.get(row["table"]), row)})
    return pd.DataFrame(rows).drop(columns="row").drop_duplicates().reset_index(drop=True)


def run_command(spec: TableSpec | None, row: dict[str, str]) -> str:
    """The command that makes the run of a missing row: the table's experiment preset
    (``conf/experiment/<table>.yaml``, or ``<tag>_full.yaml`` for the full cache, which the tables of one setup
    share) with the row's model, task, method, budget and question mode; a resumed run completes the datasets it
    lacks.  ``spec``: ``None`` for a table of the caller's own (no preset): the row's choices alone."""
    from kvbench.resources import conf_dir

    experiment = spec.id if spec is not None else ""
    if spec is not None and row["method"] == "full":
        tag = next((t for t in spec.tags_for("full") if t), None)
        if tag is not None and (conf_dir() / "experiment" / f"{tag}_full.yaml").is_file():
            experiment = f"{tag}_full"
    parts = ["python run.py"]
    if experiment and (conf_dir() / "experiment" / f"{experiment}.yaml").is_file():
        parts.append(f"+experiment={experiment}")
    parts += [f"model={row['model']}", f"task={row['task']}", f"method={row['method']}", f"budget={row['budget']}"]
    mode = row.get("question_mode")
    if isinstance(mode, str) and mode:
        parts.append(f"task.question_mode={mode}")
    return " ".join(parts)


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
    """Write ``<out>/<table>.{md,csv,tex}``, ``missing_runs.{csv,md}``, ``index.md`` and, with ``tex``,
    ``all_tables.tex`` (one LaTeX document of every table); returns the missing list."""
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
            f"{'' if math.isnan(mad) else f'{mad:.2f}'} | {len(miss)} |"
        )
    missing = pd.concat(all_missing, ignore_index=True) if all_missing else pd.DataFrame()
    missing.to_csv(out / "missing_runs.csv", index=False)
    md = ["# Missing runs", "", "Every paper cell we cannot fill, grouped by run.", ""]
    md += [
        f"- {m.table}: {m.model} / {m.task} / {m.method} / {m.budget} ({m.question_mode or 'any'}): {m.what}; "
        f"run: `{m.command}`"
        for m in missing.itertuples()
    ]
    (out / "missing_runs.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    index += ["", f"{len(missing)} missing runs in total: see [missing_runs.md](missing_runs.md)."]
    if any(bool(c["synthetic"].any()) for c in comparisons.values()):
        index += ["", "**Synthetic runs** (paper values plus noise, not measurements) fill some cells."]
    (out / "index.md").write_text("\n".join(index) + "\n", encoding="utf-8")
    if "tex" in formats:
        (out / "all_tables.tex").write_text(latex_document(list(comparisons)), encoding="utf-8")
    return missing


def write_runs_overview(runs: pd.DataFrame, out_dir: str | Path) -> None:
    """``runs.csv`` (tidy, every dataset of every run) and ``runs_summary.{csv,md}`` (one row per run)."""
    from kvbench.reporting.aggregate import run_summary

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / "runs.csv", index=False)
    summary = run_summary(runs)
    summary.to_csv(out / "runs_summary.csv", index=False)
    (out / "runs_summary.md").write_text(runs_overview_markdown(summary), encoding="utf-8")
