"""Test-wide settings: offline, W&B disabled, few threads (CI machines have 2 cores)."""

import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys
from pathlib import Path

import pytest
import torch


def _use_triton_interpreter() -> None:
    """Without CUDA, run Triton kernels in its interpreter.  ``TRITON_INTERPRET`` is read when triton's language
    library is imported, and torch._dynamo can import triton early, so set the variable and drop any
    already-imported triton modules, so the next import builds them for the interpreter."""
    if torch.cuda.is_available() or os.environ.get("_KVBENCH_TRITON_INTERPRETER") == "1":
        return
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["_KVBENCH_TRITON_INTERPRETER"] = "1"
    for name in [
        n for n in sys.modules if n == "triton" or n.startswith("triton.") or n == "kvbench.kernels.triton_kernels"
    ]:
        if not name.startswith("triton._C"):  # the native extension cannot be loaded twice
            del sys.modules[name]


_use_triton_interpreter()

REPO = Path(__file__).resolve().parent.parent
# Subprocesses (`python scripts/<tool>.py`, `python run.py` from another folder) import this checkout's kvbench,
# whichever checkout pip installed in editable mode: the scripts no longer put the checkout on sys.path themselves.
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])

#: Torch threads for a test: two (CI machines have 2 cores), one for the tests that replay recordings of reference
#: code (:data:`ONE_THREAD_TESTS`).
TEST_THREADS = min(2, torch.get_num_threads())
torch.set_num_threads(TEST_THREADS)

#: Tests that compare kvbench with recordings of reference code (kvpress, the authors' repositories, the official
#: graders).  The recorders run with one torch thread, and a CPU reduction's summation order -- so the last bits of a
#: float32 or bfloat16 sum -- depends on the thread count: the reference code itself gives other bits with two
#: threads, and kvbench, doing the code's operations, gives those same other bits (checked for CAKE's bf16 cascade and
#: kvpress's CAMPress).  These tests run with one thread, as their recordings were made.
ONE_THREAD_TESTS = (
    "tests/methods/",
    "tests/parity/",
    "tests/cache/test_kv_quant_",
    "tests/metrics/test_grader_recordings.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """One torch thread for :data:`ONE_THREAD_TESTS` (set before any fixture is built), two elsewhere."""
    where = Path(str(item.path)).resolve().relative_to(REPO).as_posix()
    torch.set_num_threads(1 if where.startswith(ONE_THREAD_TESTS) else TEST_THREADS)


#: The folders under tasks/ whose text trains the :func:`tokenizer` fixture.
TOKENIZER_CORPORA = ("longbench", "needle_grid", "needlebench", "ruler")


@pytest.fixture(scope="session")
def tokenizer():
    """A real byte-level BPE tokenizer trained on the text we ship for the needle and LongBench benchmarks
    (:data:`TOKENIZER_CORPORA`, EN + ZH), built offline once.  The corpora are named, so that fixtures added for
    other benchmarks do not change this tokenizer (its token counts are what the NeedleBench size tests check)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    roots = [REPO / "tasks" / name for name in TOKENIZER_CORPORA]
    files = [path for root in roots for pattern in ("*.txt", "*.jsonl") for path in sorted(root.rglob(pattern))]
    texts = [path.read_text(encoding="utf-8") for path in sorted(files)]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=3000, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="session")
def real_tokenizer():
    """Factory: a fresh fast tokenizer of a real family (kvbench.models.tokenizers) with a published chat template;
    each family is converted once per session (about 1-3 s), each call then costs about 1 s."""
    from kvbench.models.tokenizers import build_tokenizer

    def make(family: str, template: str | None = None):
        return build_tokenizer(family, template)

    return make


@pytest.fixture(scope="module")
def tiny_llama():
    """The tiny random GQA Llama (4 layers, 4 query heads over 2 KV heads, seed 7) with kvbench's attention, and its
    tokenizer: one fresh model per test module."""
    from kvbench.models.loading import build_builtin

    model, tokenizer = build_builtin("tiny-random-llama", seed=7)
    model.set_attn_implementation("kvbench")
    return model.eval(), tokenizer
