"""The needle heatmap (x: context length, y: depth %, colour: mean score per cell), drawn by :func:`plot_needle_heatmap`
for each needle-grid run (:mod:`kvbench.tasks.needle_grid`), W&B (:mod:`kvbench.run.wandb_logging`) and the report's
plots (:mod:`kvbench.reporting.plots`).  Plain rows in, a PNG out: it imports no other kvbench module, so every layer
may draw one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def plot_needle_heatmap(
    rows: Sequence[dict[str, Any]],
    path: str | Path,
    *,
    title: str | None = None,
    score_key: str = "score",
    vmax: float = 1.0,
) -> Path:
    """Write the needle heatmap PNG (x: context length, y: depth %, colour: mean ``score_key`` per cell).

    ``rows``: dicts with ``length`` (tokens), ``depth`` (percent) and ``score_key`` (0..vmax; the set recall 0-1 by
    default) - e.g. :func:`needle_grid_rows` output or rows read back from a run's predictions.  Cells without data
    are blank.  The title gets the overall score (mean over all cells x 100 / vmax) and the colours use the same
    0-100 scale.  Returns the written path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap

    if not rows:
        raise ValueError("no rows to plot")
    lengths = sorted({int(r["length"]) for r in rows})
    depths = sorted({float(r["depth"]) for r in rows})
    sums = np.zeros((len(depths), len(lengths)))
    counts = np.zeros_like(sums)
    for r in rows:
        i, j = depths.index(float(r["depth"])), lengths.index(int(r["length"]))
        sums[i, j] += float(r[score_key])
        counts[i, j] += 1
    grid = np.divide(sums, counts, out=np.full_like(sums, np.nan), where=counts > 0)
    overall = 100.0 * float(np.nanmean(grid)) / vmax
    shown = 100.0 * grid / vmax  # colours on the title's 0-100 scale

    cmap = LinearSegmentedColormap.from_list("needle", ["#F0496E", "#EBB839", "#0CD79F"])
    width = min(max(6.0, 0.25 * len(lengths) + 3), 24.0)
    fig, ax = plt.subplots(figsize=(width, max(4.0, 0.35 * len(depths) + 2)))
    image = ax.imshow(np.ma.masked_invalid(shown), cmap=cmap, vmin=0.0, vmax=100.0, aspect="auto", origin="upper")
    ax.set_xticks(range(len(lengths)))
    ax.set_xticklabels([str(x) for x in lengths], rotation=90 if len(lengths) > 12 else 0, fontsize=8)
    ax.set_yticks(range(len(depths)))
    ax.set_yticklabels([_depth_label(d) for d in depths], fontsize=8)
    ax.set_xlabel("Context length (tokens)")
    ax.set_ylabel("Depth (%)")
    ax.set_title(f"{title + ' | ' if title else ''}Overall score {overall:.2f}")
    fig.colorbar(image, ax=ax, label=score_key if vmax == 100.0 else f"{score_key} × {100.0 / vmax:g}")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _depth_label(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
