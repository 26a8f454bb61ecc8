"""The bench's plots: time and memory against context per method and backend, append cost against cache size."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_all(rows: list[dict[str, Any]], append_rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Decode ms/token, prefill time, cache / peak memory vs context per arch (one PNG each), and append cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for arch in sorted({r["arch"] for r in rows}):
        arch_rows = [r for r in rows if r["arch"] == arch]
        memory_key = "peak_mem_bytes" if all(r["peak_mem_bytes"] not in ("", None) for r in arch_rows) else None
        panels = [
            ("decode_ms_per_token", "decode ms / token"),
            ("prefill_s", "prefill time (s)"),
            (memory_key or "cache_bytes_final", "peak memory (GiB)" if memory_key else "KV cache bytes (GiB)"),
        ]
        fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
        for ax, (key, label) in zip(axes, panels, strict=True):
            for (method, backend), series in _group(arch_rows, ("method", "backend")).items():
                series = sorted(series, key=lambda r: int(r["context"]))
                xs = [int(r["context"]) for r in series]
                ys = [float(r[key]) / (2**30 if "bytes" in key else 1) for r in series]
                ax.plot(xs, ys, marker="o", label=f"{method} ({backend})")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("context tokens")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{arch}: {arch_rows[0]['device']}, {arch_rows[0]['dtype']}")
        fig.tight_layout()
        path = out_dir / f"context_{arch}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    if append_rows:
        fig, ax = plt.subplots(figsize=(6, 4))
        for backend, series in _group(append_rows, ("backend",)).items():
            series = sorted(series, key=lambda r: int(r["cache_tokens_per_head"]))
            ax.plot(
                [int(r["cache_tokens_per_head"]) for r in series],
                [float(r["append_us"]) for r in series],
                marker="o",
                label=backend[0],
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens stored per head")
        ax.set_ylabel("append one token (us)")
        ax.set_title(f"append cost vs cache size ({append_rows[0]['device']})")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / "append_scaling.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _group(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    return groups
