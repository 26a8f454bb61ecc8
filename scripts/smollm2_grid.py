"""The real-model grid of the README ("A real model"): SmolLM2-135M-Instruct on CPU, every method family, two budgets,
question-aware and question-agnostic, on RULER NIAH (2K/4K), NeedleBench single-needle (2K/4K) and the LongBench
fixtures.

Usage::

    nice -n 5 python scripts/smollm2_grid.py run [--out results/smollm2_grid] [--phases 1 2 3]   # resumable
    python scripts/smollm2_grid.py table [--out results/smollm2_grid]                            # Markdown + CSV
    python scripts/smollm2_grid.py run --dry-run [--phases ...]      # compose and check every run, run nothing

``run`` loads the model once (``model=smollm2-135m-instruct``, converted into kvbench's model cache on first use)
and calls :func:`kvbench.evaluate` for each cell in phase order (each cell is an ordinary resumable run folder under
``<out>/runs``; a finished one is skipped in a second).  The phases are ordered by value, so a grid stopped early
still has the most useful cells: 1 = the full cache on every 2K task (what the model can do at all); 2 = every
method at 64L question-aware on the cheap cells (RULER 2K, LongBench fixtures); 3 = the same at 256L; 4 = 256L
question-agnostic; 5 = 64L question-agnostic; 6 = the full cache at 4K, then every method on RULER 4K and NeedleBench 4K
(NeedleBench 2K: the full cache only, see :data:`FULL_CACHE_ONLY`); 7 = long reasoning (not in the default phases:
``--phases 7 --out results/smollm2_reasoning``): GSM8K's fixtures with the full cache, SnapKV and H2O (decode-time
eviction) at 64L, greedy and sampled (two seeded draws per question), :data:`REASONING_CELLS`; 8 = the prefill
families of issue #43 and the kvpress-variant presets (:data:`PREFILL_METHODS`, not in the default phases:
``--phases 8 --out results/smollm2_prefill``): RULER 2K at 256L question-aware, next to the full cache; Q-Filters use
filters that the run computes first from the model's own queries on :data:`QFILTER_TEXT` (the paper's procedure,
``scripts/compute_qfilters.py``), written to ``<out>/qfilters.safetensors``.
``table`` writes ``<out>/grid.md`` and ``<out>/grid.csv`` from the summaries found (score, 95 % interval, samples,
seconds per sample from the runs' ``timings.jsonl``); with no finished run under ``<out>/runs`` (a fresh clone: the
run folders are not committed, the tables are) it exits with status 2 and one line, leaving the tables as they are;
tables that would lose rows they hold (``run --phases 1`` after the whole grid) are left as they are too (exit 2, one
line naming ``--replace``, which writes them anyway).

The inputs are kvbench's shipped stand-ins (RULER's essays/words, NeedleBench's needles and haystacks, the LongBench
fixtures -- not the benchmarks' own data), with very few samples per dataset; see the README for what that shows.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvbench.resources import checkout_dir

MODEL = "smollm2-135m-instruct"
#: NACL as nacl_short: the nacl preset (the reference) compresses no prompt of 2,048 tokens or fewer, i.e. none here.
METHODS = ("streamingllm", "h2o", "tova", "snapkv", "pyramidkv", "ada_snapkv", "cake", "ahakv", "xkv", "nacl_short")
BUDGETS = ("64L", "256L")
MODES = ("aware", "agnostic")
#: Samples per dataset (RULER, LongBench) and needle depths (NeedleBench, one repeat each).
SAMPLES = 2
NEEDLE_DEPTHS = (25, 75)
MAX_NEW_TOKENS = 24


@dataclass(frozen=True)
class Cell:
    """One task setting of the grid: a name (the run tag), the task preset and its overrides."""

    name: str
    task: str
    overrides: tuple[str, ...]
    #: Whether the method rows run it in phases 2-5 (else only phase 6).
    cheap: bool


#: RULER has no template for SmolLM2 (its default, ``chat_template=ruler``, would feed the bare task text to this
#: instruct model): the grid renders the model's own ChatML template.
RULER_CHAT = "task.options.chat_template=model"
LONGBENCH_FIXTURES = ("qasper", "hotpotqa", "multifieldqa_en", "samsum", "trec", "passage_retrieval_en")
CELLS = (
    Cell(
        "ruler2k",
        "ruler",
        (
            "task.length=2048",
            "task.datasets=[niah_single_2,niah_multikey_1]",
            RULER_CHAT,
            f"task.options.max_new_tokens={MAX_NEW_TOKENS}",
        ),
        True,
    ),
    Cell(
        "longbench_fixtures",
        "longbench",
        (
            "task.data_dir=fixtures",
            f"task.datasets=[{','.join(LONGBENCH_FIXTURES)}]",
            f"task.options.max_new_tokens={MAX_NEW_TOKENS}",
        ),
        True,
    ),
    Cell(
        "ruler4k",
        "ruler",
        (
            "task.length=4096",
            "task.datasets=[niah_single_2]",
            RULER_CHAT,
            f"task.options.max_new_tokens={MAX_NEW_TOKENS}",
        ),
        False,
    ),
    Cell(
        "needle2k",
        "needlebench",
        (
            "task.datasets=[single_retrieval_en]",
            "task.options.size=4k",
            "task.lengths=[2000]",
            f"task.depths=[{','.join(map(str, NEEDLE_DEPTHS))}]",
            "task.options.repeats=1",
            f"task.options.max_new_tokens={MAX_NEW_TOKENS}",
        ),
        False,
    ),
    Cell(
        "needle4k",
        "needlebench",
        (
            "task.datasets=[single_retrieval_en]",
            "task.options.size=4k",
            "task.lengths=[4000]",
            f"task.depths=[{','.join(map(str, NEEDLE_DEPTHS))}]",
            "task.options.repeats=1",
            f"task.options.max_new_tokens={MAX_NEW_TOKENS}",
        ),
        False,
    ),
)
#: Full-cache only (phase 1): RULER tasks beyond NIAH, to show what the model cannot do even with every token.
FULL_ONLY_CELLS = (
    Cell(
        "ruler2k_other",
        "ruler",
        (
            "task.length=2048",
            "task.datasets=[vt,cwe]",
            RULER_CHAT,
            f"task.options.max_new_tokens={MAX_NEW_TOKENS}",
        ),
        False,
    ),
)


#: Phase 7: GSM8K's three fixture questions (``task=reasoning``), greedy and sampled (R-KV's temperature 0.6, top-p
#: 0.95, two draws per question), 256 new tokens; run with the full cache and :data:`REASONING_METHODS` at 64L.
REASONING_MAX_NEW_TOKENS = 256
REASONING_CELLS = tuple(
    Cell(
        f"gsm8k_{decoding}",
        "reasoning",
        (
            "task.data_dir=fixtures",
            "task.datasets=[gsm8k]",
            f"task.options.max_new_tokens={REASONING_MAX_NEW_TOKENS}",
            *extra,
        ),
        False,
    )
    for decoding, extra in (
        ("greedy", ()),
        ("sampled", ("task.options.sampling=sampled", "task.options.n_samples=2")),
    )
)
REASONING_METHODS = ("snapkv", "h2o")

#: Phase 8: issue #43's prefill scorers (kvpress's presses) and the kvpress-variant presets of existing families.
PREFILL_METHODS = (
    "knorm",
    "random",
    "keydiff",
    "lagkv",
    "cur",
    "qfilter",
    "noncausal",
    "expected_attention",
    "leverage",
    "compactor",
    "snapkv_kvpress",
    "tova_kvpress",
    "streamingllm_kvpress",
)
PREFILL_BUDGET = "256L"
#: Q-Filters' calibration text (local, not the RULER haystack): the repository's README, first 4,096 tokens.
QFILTER_TEXT = (checkout_dir() or Path.cwd()) / "README.md"
QFILTER_FILE = "qfilters.safetensors"
QFILTER_MAX_TOKENS = 4096


#: Cells run with the full cache only: at 2K SmolLM2-135M does not retrieve NeedleBench's needle even with every
#: token (score 6: it says what the document is about), so eviction rows would measure nothing; at 4K it does (100).
FULL_CACHE_ONLY = ("needle2k",)


def planned_runs(phases: list[int]) -> list[tuple[int, Cell, str, str, str]]:
    """(phase, cell, method, budget, question mode) in run order."""
    runs: list[tuple[int, Cell, str, str, str]] = []
    if 1 in phases:
        runs += [(1, cell, "full", "full", "aware") for cell in CELLS + FULL_ONLY_CELLS if "4k" not in cell.name]
    for phase, budget, mode in (
        (2, "64L", "aware"),
        (3, "256L", "aware"),
        (4, "256L", "agnostic"),
        (5, "64L", "agnostic"),
    ):
        if phase in phases:
            runs += [(phase, cell, m, budget, mode) for cell in CELLS if cell.cheap for m in METHODS]
    if 6 in phases:
        runs += [(6, cell, "full", "full", "aware") for cell in CELLS if "4k" in cell.name]
        runs += [
            (6, cell, m, budget, mode)
            for cell in CELLS
            if not cell.cheap and cell.name not in FULL_CACHE_ONLY
            for budget in BUDGETS
            for mode in MODES
            for m in METHODS
        ]
        runs += [(6, cell, "full", "full", "agnostic") for cell in CELLS]
    if 7 in phases:
        for cell in REASONING_CELLS:
            runs += [(7, cell, "full", "full", "aware")] + [(7, cell, m, "64L", "aware") for m in REASONING_METHODS]
    if 8 in phases:
        ruler2k = next(cell for cell in CELLS if cell.name == "ruler2k")
        runs += [(8, ruler2k, "full", "full", "aware")]
        runs += [(8, ruler2k, m, PREFILL_BUDGET, "aware") for m in PREFILL_METHODS]
    return runs


def method_overrides(method: str, out: Path) -> tuple[str, ...]:
    """Overrides a method needs beyond its preset: Q-Filters read the filters computed under ``out``."""
    if method == "qfilter":
        return (f"method.params.filters={(out / QFILTER_FILE).resolve()}",)
    return ()


def ensure_qfilters(out: Path, model, tokenizer) -> None:
    """Write ``<out>/qfilters.safetensors`` from ``model``'s queries on :data:`QFILTER_TEXT` unless it exists
    (``scripts/compute_qfilters.py``'s computation on the model already loaded)."""
    path = out / QFILTER_FILE
    if path.is_file():
        return
    import importlib.util

    from safetensors.torch import save_file

    spec = importlib.util.spec_from_file_location("compute_qfilters", Path(__file__).parent / "compute_qfilters.py")
    compute_qfilters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compute_qfilters)
    filters, used = compute_qfilters.compute(model.eval(), tokenizer, QFILTER_TEXT.read_text(), QFILTER_MAX_TOKENS)
    out.mkdir(parents=True, exist_ok=True)
    shape = json.dumps(list(filters.shape))
    metadata = {"model": MODEL, "text": QFILTER_TEXT.name, "tokens": str(used), "shape": shape}
    save_file({compute_qfilters.FILTERS_KEY: filters.contiguous()}, str(path), metadata=metadata)
    print(f"{path}: q_filters {list(filters.shape)} from {used} tokens of {QFILTER_TEXT.name}", flush=True)


def run_grid(out: Path, phases: list[int]) -> None:
    """Run the planned cells in order, skipping finished ones (each an ordinary resumable run)."""
    import kvbench
    from kvbench.api import compose_config
    from kvbench.errors import Interrupted
    from kvbench.models.loading import load_model

    model_cfg = compose_config(model=MODEL).model
    started = time.perf_counter()
    loaded = load_model(model_cfg)
    print(f"model loaded in {time.perf_counter() - started:.1f} s", flush=True)
    planned = planned_runs(phases)
    if any(method == "qfilter" for _, _, method, _, _ in planned):
        ensure_qfilters(out, loaded.model, loaded.tokenizer)
    for phase, cell, method, budget, mode in planned:
        tag = f"{cell.name}-{mode}"
        label = f"phase {phase}: {cell.name} {method} {budget} {mode}"
        folder = out / "runs" / MODEL / cell.task / method / f"{budget}~{tag}"
        if _finished(folder):
            continue
        started = time.perf_counter()
        try:
            kvbench.evaluate(
                loaded.model,
                loaded.tokenizer,
                method,
                budget,
                cell.task,
                question_mode=mode,
                limit=None if cell.task in ("needlebench", "reasoning") else SAMPLES,
                output_dir=out,
                model_config=MODEL,
                overrides=[*cell.overrides, *method_overrides(method, out), f"run.tag={tag}"],
                progress=False,
            )
        except Interrupted:  # SIGTERM/SIGINT: stop here; rerunning resumes
            raise
        except Exception as err:  # a batch: report the cell and go on with the next one
            print(f"{label}: error: {err.__class__.__name__}: {err}", flush=True)
            continue
        print(f"{label}: {time.perf_counter() - started:.0f} s", flush=True)


def _finished(folder: Path) -> bool:
    meta = folder / "run_meta.json"
    return meta.is_file() and json.loads(meta.read_text()).get("status") == "complete"


def collect(out: Path) -> list[dict]:
    """One row per (cell, method, budget, mode, dataset) from the run folders' summary.json and timings.jsonl."""
    rows = []
    for summary_path in sorted((out / "runs" / MODEL).glob("*/*/*/summary.json")):
        summary = json.loads(summary_path.read_text())
        run = summary["run"]
        budget, _, tag = Path(run["results_folder"]).name.partition("~")
        cell, _, mode = tag.rpartition("-")
        for entry in summary["datasets"]:
            timings_path = summary_path.parent / entry["dataset"] / "timings.jsonl"
            seconds = [json.loads(line) for line in timings_path.read_text().splitlines() if line.strip()]
            per_sample = sum(t.get("prefill_s", 0) + t.get("decode_s", 0) for t in seconds) / max(len(seconds), 1)
            rows.append(
                {
                    "cell": cell,
                    "method": run["method"],
                    "budget": budget,
                    "mode": mode,
                    "dataset": entry["dataset"],
                    "score": entry["score"],
                    "ci95_low": entry["ci95"][0],
                    "ci95_high": entry["ci95"][1],
                    "n": entry.get("n_samples", len(seconds)),
                    "seconds_per_sample": round(per_sample, 1),
                }
            )
    return rows


def _run_summaries(out: Path) -> dict[tuple[str, str, str, str], dict]:
    """(cell, method, budget, mode) -> that run's summary.json."""
    found = {}
    for path in (out / "runs" / MODEL).glob("*/*/*/summary.json"):
        summary = json.loads(path.read_text())
        budget, _, tag = Path(summary["run"]["results_folder"]).name.partition("~")
        cell, _, mode = tag.rpartition("-")
        found[(cell, summary["run"]["method"], budget, mode)] = summary
    return found


def _cell_text(summary: dict | None, dataset: str | None) -> str:
    """``score [low, high]`` of one dataset (``None``: the run's mean over its datasets); ``-`` when not run."""
    if summary is None:
        return "-"
    if dataset is None:
        entry = summary["averages"]["mean"]
    else:
        entry = next((d for d in summary["datasets"] if d["dataset"] == dataset), None)
        if entry is None:
            return "-"
    low, high = entry["ci95"]
    return f"{entry['score']:.0f} [{low:.0f}, {high:.0f}]"


def readme_table(out: Path) -> str:
    """The README's grid: one row per method, budget and mode; RULER 2K's two NIAH tasks, RULER 4K's niah_single_2,
    NeedleBench 4K's single-needle retrieval and the LongBench fixtures' mean, each with its 95 % interval, and the
    seconds per sample over those runs."""
    found = _run_summaries(out)
    lines = [
        "| method | budget | mode | RULER 2K niah_single_2 | RULER 2K niah_multikey_1 | RULER 4K niah_single_2 "
        "| NeedleBench 4K single_retrieval_en | LongBench fixtures (mean of 6) | s/sample |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    methods = METHODS + PREFILL_METHODS
    rows = [("full", "full", "aware")] + [(m, b, mode) for b in BUDGETS for mode in MODES for m in methods]
    for method, budget, mode in rows:
        ruler = found.get(("ruler2k", method, budget, mode))
        ruler4k = found.get(("ruler4k", method, budget, mode))
        needle4k = found.get(("needle4k", method, budget, mode))
        longbench = found.get(("longbench_fixtures", method, budget, mode))
        runs = (ruler, ruler4k, needle4k, longbench)
        if all(run is None for run in runs):
            continue
        timed = [s["timing"] for s in runs if s is not None]
        seconds = sum(t["total_s"] for t in timed) / max(sum(t["n"] for t in timed), 1)
        cells = [
            _cell_text(ruler, "niah_single_2"),
            _cell_text(ruler, "niah_multikey_1"),
            _cell_text(ruler4k, "niah_single_2"),
            _cell_text(needle4k, "single_retrieval_en"),
            _cell_text(longbench, None),
        ]
        lines.append(f"| {method} | {budget} | {mode} | {' | '.join(cells)} | {seconds:.0f} |")
    return "\n".join(lines) + "\n"


def write_table(out: Path, rows: list[dict]) -> str:
    """``grid.csv`` (``rows``, from :func:`collect`) and ``grid.md`` (one line per run: each dataset's score [95 %
    interval], seconds per sample); returns the Markdown."""
    with (out / "grid.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    order = {m: i for i, m in enumerate(("full", *METHODS, *PREFILL_METHODS))}
    grouped: dict[tuple, list[dict]] = {}
    for row in rows:
        grouped.setdefault((row["cell"], row["budget"], row["mode"], row["method"]), []).append(row)
    lines = [
        "| cell | budget | mode | method | scores (95 % interval), n per dataset | s/sample |",
        "|---|---|---|---|---|---|",
    ]
    for key in sorted(grouped, key=lambda k: (k[0], k[1] != "full", k[1], k[2], order.get(k[3], 99))):
        cell, budget, mode, method = key
        parts = [
            f"{r['dataset']} {r['score']:.0f} [{r['ci95_low']:.0f}, {r['ci95_high']:.0f}] n={r['n']}"
            for r in grouped[key]
        ]
        cost = sum(r["seconds_per_sample"] for r in grouped[key]) / len(grouped[key])
        lines.append(f"| {cell} | {budget} | {mode} | {method} | {'; '.join(parts)} | {cost:.1f} |")
    markdown = "\n".join(lines) + "\n"
    (out / "grid.md").write_text(markdown + "\nREADME table:\n\n" + readme_table(out))
    return markdown


def dry_run(out: Path, phases: list[int]) -> int:
    """Compose and check every planned run's config as :func:`run_grid` would run it, loading no model; prints one
    line per run and returns the count (a config that does not compose raises, naming it)."""
    from kvbench.app.sweep import Composer
    from kvbench.app.validation import validate

    planned = planned_runs(phases)
    composer = Composer()  # one Hydra context for every run (as a sweep's planner composes its jobs)
    try:
        for phase, cell, method, budget, mode in planned:
            groups = [f"model={MODEL}", f"method={method}", f"budget={budget}", f"task={cell.task}"]
            extra = [*cell.overrides, *method_overrides(method, out), f"run.tag={cell.name}-{mode}"]
            validate(composer.compose([*groups, *extra, f"task.question_mode={mode}"]))
            print(f"phase {phase}: {cell.name} {method} {budget} {mode}: composes")
    finally:
        composer.close()
    print(f"{len(planned)} runs of phases {' '.join(map(str, phases))} compose and validate (nothing run)")
    return len(planned)


def rows_left_out(out: Path, rows: list[dict]) -> int:
    """How many rows of the existing ``<out>/grid.csv`` (committed: every phase) ``rows`` would drop."""
    path = out / "grid.csv"
    if not path.is_file():
        return 0
    with path.open(newline="") as handle:
        old = {tuple(row.get(k) for k in GRID_KEY) for row in csv.DictReader(handle)}
    new = {tuple(str(row[k]) for k in GRID_KEY) for row in rows}
    return len(old - new)


#: The columns that name one row of ``grid.csv``.
GRID_KEY = ("cell", "method", "budget", "mode", "dataset")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("run", "table"))
    parser.add_argument("--out", type=Path, default=Path("results/smollm2_grid"))
    parser.add_argument("--phases", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6], choices=range(1, 9))
    parser.add_argument("--dry-run", action="store_true", help="run: compose and check every run, run nothing")
    parser.add_argument(
        "--replace", action="store_true", help="write grid.{md,csv} even when they would lose rows they hold now"
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        dry_run(args.out, args.phases)
        return 0
    if args.action == "run":
        run_grid(args.out, args.phases)
    rows = collect(args.out)
    if not rows:
        print(
            f"error: no finished run under {args.out / 'runs' / MODEL}: nothing to tabulate, {args.out}/grid.md and "
            "grid.csv left as they are (run the grid first: python scripts/smollm2_grid.py run)",
            file=sys.stderr,
        )
        return 2
    dropped = rows_left_out(args.out, rows)
    if dropped and not args.replace:
        print(
            f"error: {args.out}/grid.csv holds {dropped} rows of runs not found under {args.out / 'runs'} (phases "
            f"not run here); grid.md and grid.csv left as they are. Run those phases too, or pass --replace to "
            "write the tables of the runs found alone.",
            file=sys.stderr,
        )
        return 2
    write_table(args.out, rows)
    print((args.out / "grid.md").read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
