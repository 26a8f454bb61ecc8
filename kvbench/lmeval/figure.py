"""AhaKV Figure 4's layout: accuracy against the KV budget, one panel per model x short-text task.

Reads every ``metrics.json`` of ``task=lmeval`` runs (:func:`kvbench.reporting.aggregate.load_runs`) and draws, per
tag and question mode, a grid with one row per model and one column per lm-eval task (the paper's order: OpenBookQA,
ARC-E, WiC, WinoGrande, then any other task): x = the kept budget in percent of the prompt (60 % on the left down to
4 % on the right, as the figure's "60%-4%"), y = the headline accuracy, one line per method, the full cache as a
dashed horizontal line.  The paper prints no numbers for Figure 4, so there is no reference curve to overlay.

``python -m kvbench.lmeval.figure [--runs results/runs] [--tag ahakv_fig4] [--out results/plots]``
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from kvbench.reporting.aggregate import load_runs
from kvbench.reporting.plots import budget_value

#: Column order of the figure (Sec. 5.2.2 lists "OpenBook, ARC-E, WiC, and WinoGrande").
PAPER_TASKS = ("openbookqa", "arc_easy", "wic", "winogrande")
#: Line order: the paper's method, its baseline, then the other baselines of Sec. 5.1.
PAPER_METHODS = ("ahakv", "h2o", "streamingllm", "snapkv", "nacl_short", "nacl", "tova")


def _ordered(values: Sequence[str], preferred: Sequence[str]) -> list[str]:
    present = list(dict.fromkeys(values))
    return [v for v in preferred if v in present] + sorted(v for v in present if v not in preferred)


def plot_accuracy_vs_budget(runs: pd.DataFrame, out_dir: str | Path, tag: str | None = None) -> list[Path]:
    """One PNG per (tag, question mode) of the ``lmeval`` runs in ``runs`` (``tag``: only that one); returns the
    paths written (none when no run has a ratio budget)."""
    runs = runs[runs["task"] == "lmeval"].assign(tag=runs["tag"].fillna(""))
    if tag is not None:
        runs = runs[runs["tag"] == tag]
    written = []
    for (run_tag, mode), group in runs.groupby(["tag", "question_mode"], sort=True):
        parsed = group["budget"].map(budget_value)
        ratio = group[parsed.map(lambda p: p is not None and p[0] == "x")]
        ratio = ratio.assign(percent=parsed[ratio.index].map(lambda p: 100 * p[1]))
        full = group[group["method"] == "full"]
        if ratio.empty:
            continue
        models = sorted(group["model"].unique())
        tasks = _ordered(group["dataset"], PAPER_TASKS)
        methods = _ordered(ratio["method"], PAPER_METHODS)
        colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
        fig, axes = plt.subplots(len(models), len(tasks), figsize=(3.2 * len(tasks), 2.8 * len(models)), squeeze=False)
        for row, model in enumerate(models):
            for col, task in enumerate(tasks):
                ax = axes[row][col]
                cell = ratio[(ratio["model"] == model) & (ratio["dataset"] == task)]
                for method in methods:
                    line = cell[cell["method"] == method].sort_values("percent", ascending=False)
                    if not line.empty:
                        ax.plot(line["percent"], line["score"], "-o", ms=3, color=colours[method], label=method)
                for score in full[(full["model"] == model) & (full["dataset"] == task)]["score"]:
                    ax.axhline(score, linestyle="--", color="black", linewidth=1, label="full cache")
                ax.set_xscale("log")
                ticks = sorted(ratio["percent"].unique(), reverse=True)
                ax.set_xticks(ticks, [f"{t:g}%" for t in ticks], fontsize=7)
                ax.minorticks_off()
                ax.set_xlim(max(ticks) * 1.15, min(ticks) / 1.15)  # 60 % left, 4 % right
                ax.grid(alpha=0.3)
                ax.set_title(f"{model} · {task}", fontsize=9)
                if col == 0:
                    ax.set_ylabel("accuracy (%)")
                if row == len(models) - 1:
                    ax.set_xlabel("KV budget (% of the prompt)")
        handles, labels = axes[0][0].get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=True))
        columns = min(len(unique), 5)
        fig.legend(unique.values(), unique.keys(), loc="lower center", ncol=columns, fontsize=8, frameon=False)
        title = " · ".join(x for x in ("short-text accuracy vs KV budget", run_tag, mode) if x)
        fig.suptitle(title + " (the paper prints no numbers for its Figure 4)", fontsize=10)
        fig.tight_layout(rect=(0, 0.1, 1, 0.95))
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"lmeval_accuracy_vs_budget_{run_tag or 'untagged'}_{mode}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="results/runs", help="root of the run folders")
    parser.add_argument("--tag", default=None, help="only runs with this run.tag (e.g. ahakv_fig4)")
    parser.add_argument("--out", default="results/plots", help="folder for the PNGs")
    args = parser.parse_args(argv)
    paths = plot_accuracy_vs_budget(load_runs(args.runs), args.out, args.tag)
    print("\n".join(str(p) for p in paths) if paths else "no task=lmeval runs with ratio budgets found")


if __name__ == "__main__":
    main()
