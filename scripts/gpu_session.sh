#!/usr/bin/env bash
# kvbench's GPU validation in ONE device call (issue #26): install the carried wheels, then scripts/gpu_validate.py
# under its own deadline (default 420 s; it writes <= 8 files to $OUT, row by row, and stops cleanly on a signal).
#
# Once, on the CPU machine: `make gpu-wheels` (-> .whl/, ~17 MB: transformers 5.23, hydra-core 1.3.8, omegaconf 2.3.1,
# antlr4 4.9.3 built from its sdist, huggingface_hub 1.33 if the machine's is older than transformers 5.23 needs, the
# Llama-3 and Mistral v3 tokenizer files).  Then one device call, carry [".whl"], timeout_s 480:
#   bash scripts/gpu_session.sh                 # extra arguments go to gpu_validate.py, e.g. --deadline 240 --skip llama
set -uo pipefail
out="${OUT:-results/bench/gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled OMP_NUM_THREADS=8
site=/tmp/kvbench-site
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
        || exit 1
    if ! python3 -c 'import sys, huggingface_hub as h; v = tuple(map(int, h.__version__.split(".")[:2])); sys.exit(v < (1, 31))'; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/if-needed/*.whl \
            || exit 1
    fi
    export PYTHONPATH="$site:$PWD" KVBENCH_TOKENIZER_FILES="$PWD/.whl/tokenizer_files"
else
    export PYTHONPATH="$PWD"
fi
exec python3 scripts/gpu_validate.py --out "$out" "$@"
