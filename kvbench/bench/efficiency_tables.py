"""The papers' efficiency tables rebuilt from the bench's measurements, the papers' numbers beside ours: CAKE
Table 13, Ada-KV's maximum context under a memory limit, XKV Table IV (CSV + Markdown)."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kvbench.bench.random_models import ARCHITECTURES
from kvbench.resources import paper_dir


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write dict rows (union of keys, in first-seen order); an empty list writes nothing."""
    if not rows:
        return
    fields: list[str] = []
    for row in rows:
        fields.extend(k for k in row if k not in fields)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(v) for k, v in row.items()})


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


def _paper_rows(table: str) -> list[dict[str, str]]:
    path = paper_dir() / f"{table}.csv"
    if not path.exists():
        return []
    with open(path) as handle:
        return list(csv.DictReader(handle))


def rebuild_tables(rows: list[dict[str, Any]], out_dir: Path, meta: dict[str, Any]) -> dict[str, str]:
    """CAKE Table 13, Ada-KV max context, XKV Table IV: paper numbers beside ours (or why ours are missing)."""
    written = {}
    written["cake_t13"] = str(_cake_t13(rows, out_dir, meta))
    written["adakv_max_context"] = str(_max_context(rows, out_dir, meta))
    written["xkv_t4"] = str(_xkv_t4(rows, out_dir, meta))
    return written


_T13_COLUMNS = ("overall_s", "prefill_s", "decode_s", "decode_ms_per_token")


def _cake_t13(rows: list[dict[str, Any]], out_dir: Path, meta: dict[str, Any]) -> Path:
    """Table 13 layout (Mistral-7B, budget 1024L, 1024 generated tokens): paper vs ours on the same architecture
    when measured (``mistral-7b`` rows), plus our CPU configurations in the same layout, labelled."""
    paper = _paper_rows("cake_t13")
    table: list[dict[str, Any]] = []
    ours = {(int(r["context"]), r["method"]): r for r in rows if r["arch"] == "mistral-7b"}
    for prow in paper:
        prefill_len = int(prow["budget_label"].split("+")[0]) if "+" in prow["budget_label"] else None
        mine = ours.get((prefill_len, prow["method"])) if prefill_len else None
        value = ""
        if mine is not None:
            value = _t13_value(mine, prow["column"])
        table.append(
            {
                "source": "paper vs ours (mistral-7b arch)",
                "length": prow["budget_label"],
                "method": prow["method_label"],
                "column": prow["column"],
                "paper": prow["value"],
                "ours": value if value != "" else "not measured (needs the GPU preset)",
                "ours_device": mine["device"] if mine else "",
                "ours_decode_tokens": mine["decode_tokens"] if mine else "",
            }
        )
    for row in rows:
        if row["arch"] == "mistral-7b":
            continue
        for column in _T13_COLUMNS:
            table.append(
                {
                    "source": f"ours only ({row['arch']}, {row['backend']}, CPU-size config)",
                    "length": f"{row['context']}+{row['decode_tokens']}",
                    "method": row["method"],
                    "column": column,
                    "paper": "",
                    "ours": _t13_value(row, column),
                    "ours_device": row["device"],
                    "ours_decode_tokens": row["decode_tokens"],
                }
            )
    path = out_dir / "cake_t13.csv"
    write_csv(path, table)
    _write_markdown(out_dir / "cake_t13.md", "CAKE Table 13 (prefill / decode latency)", table, meta)
    return path


def _t13_value(row: dict[str, Any], column: str) -> float:
    if column == "overall_s":
        return round(float(row["prefill_s"]) + float(row["decode_s"]), 4)
    if column == "decode_ms_per_token":
        return round(float(row["decode_ms_per_token"]), 3)
    return round(float(row[column]), 4)


def _max_context(rows: list[dict[str, Any]], out_dir: Path, meta: dict[str, Any]) -> Path:
    """Ada-KV-style "max context under a memory limit" (80 GB and 141 GB): a linear fit of measured peak memory vs
    context per (arch, method) when CUDA peaks exist; otherwise an analytic estimate from the architecture (weights
    + full KV of one layer during prefill + compressed KV of the others + prefill activations), labelled."""
    table = []
    limits_gb = (80.0, 141.0)
    by_key: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for row in rows:
        if row["peak_mem_bytes"] not in ("", None):
            by_key.setdefault((row["arch"], row["method"]), []).append(
                (int(row["context"]), float(row["peak_mem_bytes"]))
            )
    for (arch, method), points in sorted(by_key.items()):
        if len(points) < 2:
            continue
        xs, ys = zip(*sorted(points), strict=True)
        slope, intercept = _linear_fit(xs, ys)
        weights = _analytic_weight_bytes(arch)
        for limit in limits_gb:
            room = limit * 1e9 - weights - intercept
            table.append(
                {
                    "arch": arch,
                    "method": method,
                    "memory_limit_gb": limit,
                    "max_context_tokens": int(room / slope) if slope > 0 else "unbounded by KV",
                    "source": f"fit of {len(points)} measured CUDA peaks",
                }
            )
    for arch in ("llama3.1-8b", "mistral-7b"):
        for method, budget in (("full", None), ("budget 1024L", 1024)):
            for limit in limits_gb:
                table.append(
                    {
                        "arch": arch,
                        "method": method,
                        "memory_limit_gb": limit,
                        "max_context_tokens": _analytic_max_context(arch, limit * 1e9, budget),
                        "source": "analytic (bf16 weights + KV + prefill activations), not measured",
                    }
                )
    path = out_dir / "adakv_max_context.csv"
    write_csv(path, table)
    _write_markdown(out_dir / "adakv_max_context.md", "Max context under a memory limit (Ada-KV)", table, meta)
    return path


def _linear_fit(xs: Iterable[float], ys: Iterable[float]) -> tuple[float, float]:
    x, y = list(xs), list(ys)
    mean_x, mean_y = sum(x) / len(x), sum(y) / len(y)
    var = sum((a - mean_x) ** 2 for a in x)
    slope = sum((a - mean_x) * (b - mean_y) for a, b in zip(x, y, strict=True)) / var if var else 0.0
    return slope, mean_y - slope * mean_x


def _kv_bytes_per_token_per_layer(arch: str, itemsize: int = 2) -> int:
    spec = ARCHITECTURES[arch]
    head_dim = spec["hidden_size"] // spec["num_attention_heads"]
    return spec["num_key_value_heads"] * head_dim * 2 * itemsize


def _analytic_weight_bytes(arch: str, itemsize: int = 2) -> float:
    spec = ARCHITECTURES[arch]
    hidden, inter, layers = spec["hidden_size"], spec["intermediate_size"], spec["num_hidden_layers"]
    kv_dim = spec["num_key_value_heads"] * hidden // spec["num_attention_heads"]
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_dim + 3 * hidden * inter + 2 * hidden
    return float((layers * per_layer + 2 * spec["vocab_size"] * hidden + hidden) * itemsize)


def _analytic_max_context(arch: str, limit_bytes: float, budget: int | None, itemsize: int = 2) -> int:
    """Largest context whose prefill fits: weights + KV + activations (hidden states, one layer's MLP
    intermediates and QKV, in bf16; attention itself is flash-style, O(S) memory)."""
    spec = ARCHITECTURES[arch]
    hidden, inter, layers = spec["hidden_size"], spec["intermediate_size"], spec["num_hidden_layers"]
    per_layer_kv = _kv_bytes_per_token_per_layer(arch, itemsize)
    activations_per_token = (4 * hidden + 3 * inter) * itemsize
    room = limit_bytes - _analytic_weight_bytes(arch, itemsize)
    if budget is None:
        per_token = layers * per_layer_kv + activations_per_token
        return max(0, int(room / per_token))
    # With eviction during prefill: one layer's full KV at a time, the others hold `budget` tokens.
    room -= layers * budget * per_layer_kv
    return max(0, int(room / (per_layer_kv + activations_per_token)))


def _xkv_t4(rows: list[dict[str, Any]], out_dir: Path, meta: dict[str, Any]) -> Path:
    """XKV Table IV layout (Llama-3-8B, NarrativeQA, 200 samples): KV cache GB per sample is computed from the
    architecture at the measured bytes per stored token; runtimes come from llama3.1-8b GPU rows when present."""
    paper = _paper_rows("xkv_t4")
    table = []
    context = 8192  # LongBench prompts are truncated to the model window (8K for Llama-3-8B)
    per_token_all_layers = (
        _kv_bytes_per_token_per_layer("llama3.1-8b") * ARCHITECTURES["llama3.1-8b"]["num_hidden_layers"]
    )
    gpu_rows = {r["method"]: r for r in rows if r["arch"] == "llama3.1-8b" and int(r["context"]) == context}
    for prow in paper:
        method = prow["method"]
        ours: Any = ""
        note = ""
        if prow["column"] == "kv_cache_gb":
            if method == "full":
                ours = round(context * per_token_all_layers / 1e9, 3)
                groups = (
                    ARCHITECTURES["llama3.1-8b"]["num_attention_heads"]
                    // ARCHITECTURES["llama3.1-8b"]["num_key_value_heads"]
                )
                expanded_gib = context * per_token_all_layers * groups / 2**30
                note = (
                    f"computed (bf16): {context} tokens x {per_token_all_layers} B/token with one cache per KV head; "
                    f"one per query head (x{groups}) is {expanded_gib:.2f} GiB, which is the paper's 4.00"
                )
            else:
                note = "XKV's compression ratio for this row is not stated; see bench.csv for our budgets"
        elif prow["column"] in ("total_runtime_s", "single_task_runtime_s"):
            mine = gpu_rows.get(method)
            if mine:
                single = float(mine["prefill_s"]) + float(mine["decode_s"])
                ours = round(single * (200 if prow["column"] == "total_runtime_s" else 1), 2)
                note = f"random tokens, {mine['decode_tokens']} decoded tokens, {mine['device']}"
            else:
                note = "not measured (needs the GPU preset with llama3.1-8b at 8K)"
        elif prow["column"] == "max_batch_size":
            note = "n/a: kvbench runs batch size 1"
        table.append(
            {
                "method": prow["method_label"],
                "column": prow["column"],
                "paper": prow["value"],
                "ours": ours,
                "note": note,
            }
        )
    path = out_dir / "xkv_t4.csv"
    write_csv(path, table)
    _write_markdown(out_dir / "xkv_t4.md", "XKV Table IV (efficiency on NarrativeQA)", table, meta)
    return path


def _write_markdown(path: Path, title: str, table: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    if not table:
        path.write_text(f"# {title}\n\n(no rows)\n")
        return
    fields = list(table[0])
    lines = [
        f"# {title}",
        "",
        f"Measured on {meta['device_name']} ({meta['device']}, {meta['dtype']}, torch {meta['torch']}).",
        "",
        "| " + " | ".join(fields) + " |",
        "|" + "---|" * len(fields),
    ]
    lines += ["| " + " | ".join(str(_fmt(row.get(f, ""))) for f in fields) + " |" for row in table]
    path.write_text("\n".join(lines) + "\n")
