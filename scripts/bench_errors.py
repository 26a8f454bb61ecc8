#!/usr/bin/env python
"""Time to the error: how long ``python run.py <bad input>`` takes to exit, and whether torch was imported first.

Timed as ``python -m kvbench <bad input>`` (the same app as ``python run.py`` and the ``kvbench`` command), run
from the working directory; outputs go under it.

Writes ``<out>/bad_input.csv`` (one row per case: median and minimum seconds over ``--repeats`` runs, exit status,
torch imported before the error or not, the error's first 100 characters) and ``<out>/bad_input.json`` (the same
plus the machine's load average before and after, so that numbers from a busy machine can be recognised).

    python scripts/bench_errors.py                       # results/bench/bad_input.{csv,json}
    python scripts/bench_errors.py --repeats 5 --out /tmp/errors

The target (issue #20): a bad config value reports its error within 2 s on an idle machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kvbench import resources

#: (label, overrides, stage): "config" cases must fail before torch is imported; "torch" cases need the method
#: family or task registry (torch + transformers), "data" cases the tokenizer and the data files.
CASES: list[tuple[str, list[str], str]] = [
    ("unknown method preset", ["method=nonexistent"], "config"),
    ("misspelt key", ["method.windw=3"], "config"),
    ("misspelt key added with +", ["+method.windw=8"], "config"),
    ("wrongly typed value", ["method.params.window=abc"], "config"),
    ("bad budget", ["budget.spec=12x"], "config"),
    ("zero budget", ["budget.spec=0L"], "config"),
    ("window 0", ["method.params.window=0"], "config"),
    ("even kernel_size", ["method.params.kernel_size=6"], "torch"),  # a family knob: checked as the method builds
    ("bad question mode", ["task.question_mode=both"], "config"),
    ("missing local model", ["model.path=models/missing"], "config"),
    ("hub model not cached (offline)", ["model=llama3.1-8b-instruct"], "config"),
    ("missing data folder", ["task=longbench", "task.data_dir=/nonexistent"], "config"),
    ("unknown family parameter", ["+method.params.nope=1"], "torch"),
    ("unknown method family", ["method.family=snapkvv"], "torch"),
    ("corrupt LongBench line", ["model=tiny-random-llama", "task=longbench", "task.datasets=[qasper]"], "data"),
]


def run_once(overrides: list[str], importtime: bool, env: dict[str, str]) -> tuple[float, int, str]:
    flags = ["-X", "importtime"] if importtime else []
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, *flags, "-m", "kvbench", *overrides], capture_output=True, text=True, env=env
    )
    return time.perf_counter() - start, result.returncode, result.stderr


def torch_imported(stderr: str) -> bool:
    lines = [line for line in stderr.splitlines() if line.startswith("import time:")]
    return any(line.split("|")[-1].strip() == "torch" for line in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = args.out / "bad_input_scratch"
    corrupt = scratch / "longbench"
    corrupt.mkdir(parents=True, exist_ok=True)
    good = (resources.tasks_dir() / "longbench" / "fixtures" / "qasper.jsonl").read_text().splitlines()[0]
    (corrupt / "qasper.jsonl").write_text(good + '\n{"input": "q", "context": \n')
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    env.pop("KVBENCH_DEBUG", None)
    load_before = os.getloadavg()
    rows = []
    for label, overrides, stage in CASES:
        overrides = [*overrides, f"run.output_root={scratch / 'runs'}"]
        if label == "corrupt LongBench line":
            overrides.append(f"task.data_dir={corrupt}")
        _, _, traced = run_once(overrides, importtime=True, env=env)
        times, codes, message = [], set(), ""
        for _ in range(args.repeats):
            seconds, code, stderr = run_once(overrides, importtime=False, env=env)
            times.append(seconds)
            codes.add(code)
            message = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        row = {
            "case": label,
            "overrides": " ".join(overrides[:-1]),
            "stage": stage,
            "median_s": round(statistics.median(times), 3),
            "min_s": round(min(times), 3),
            "exit_status": ",".join(str(c) for c in sorted(codes)),
            "torch_imported": torch_imported(traced),
            "message": message[:100],
        }
        rows.append(row)
        print(
            f"{row['median_s']:6.2f} s (min {row['min_s']:.2f})  exit {row['exit_status']}  "
            f"torch={'yes' if row['torch_imported'] else 'no '}  {label}",
            flush=True,
        )
    with open(args.out / "bad_input.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = {
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "repeats": args.repeats,
        "rows": rows,
    }
    (args.out / "bad_input.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out / 'bad_input.csv'} and {args.out / 'bad_input.json'}")


if __name__ == "__main__":
    main()
