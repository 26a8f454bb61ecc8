"""NeedleBench v1 (OpenCompass, the 2024 definition CAKE's tables use): ``task=needlebench``.

Three subtasks in English and Chinese (shared/specs/benchmarks.md section 3):

* ``single_retrieval`` (S-RT, ``origin.py``): one needle at each depth of each context length;
* ``multi_retrieval`` (M-RT, ``parallel.py``): one needle per depth in the same context, all asked at once;
* ``multi_reasoning`` (M-RS, ``multi.py``): 2-5 derivation needles, the first at the depth, the next ones 10 % of
  the context apart; the question needs all of them.

A dataset here is one (subtask, language) pair (``single_retrieval_en``, ..., ``multi_reasoning_zh``) holding every
context length x depth x repeat (x needle count) of OpenCompass's per-cell datasets; its ``score`` equals the
OpenCompass group mean over those cells (cells have equal sizes).  The overall score needs all six datasets:
:func:`kvbench.metrics.synthetic.needlebench_summary` returns the group means (mean of EN and ZH) and
``overall = 0.4 S-RT + 0.3 M-RS + 0.3 M-RT``.

Haystack construction (all subtasks, OpenCompass HEAD since 2024-07): for ``counter`` in ``range(repeats)``:
``random.seed(counter)`` (shifted by ``task.seed - 42``) and shuffle the haystack records (cumulatively over
counters); choose the needle(s) -- S-RT and M-RS reseed with ``counter`` before their ``random.choice``, M-RT reseeds
before shuffling a fresh copy of its unique needles; take token-ised records in that order until ``length - buffer -
needle tokens`` tokens, cut, insert the needle tokens, decode.  Needles are wrapped in newlines.  Token arithmetic uses
the model's tokenizer (OpenCompass used tiktoken's gpt-4 encoding).  Prompts are never truncated: one longer than the
model's ``max_input_length`` is an error.  The buffers are OpenCompass's, sized for tiktoken: when the model's
tokenizer spends more on the prompt text (SentencePiece on Chinese) and the whole input (chat template included) would
exceed the context length, the haystack is shortened by the excess (``extra["haystack_trimmed"]``; 0 whenever the
buffer suffices), so every prompt fits its length.  Samples are stored in the sample cache
(kvbench.storage.sample_cache).

Inputs: ``PaulGrahamEssays.jsonl``, ``zh_finance.jsonl``, ``needles.jsonl`` and ``multi_needle_reasoning_{en,zh}.json``
from ``task.data_dir`` or ``./data/needlebench`` (HF dataset ``opencompass/NeedleBench``; ``scripts/prepare_data.py
needlebench`` writes there); each missing file is replaced by a shipped stand-in -- the filler essays, our own Chinese
text (``tasks/needlebench/haystack_zh.jsonl``), our own needles (``tasks/needlebench/needles.jsonl``, same schema),
kinship-chain reasoning records generated from ``tasks/needlebench/names.json`` -- recorded in metrics.json and
warned about when the run starts.

Modules: :mod:`~kvbench.tasks.needlebench.spec` (subtasks, sizes, prompts), :mod:`~kvbench.tasks.needlebench.inputs`
(haystacks, needles, reasoning records) and :mod:`~kvbench.tasks.needlebench.datasets` (the datasets, the
``needlebench`` builder and data preparer).
"""

from kvbench.tasks.needlebench.datasets import NeedleBenchDataset, build_needlebench, prepare_needlebench
from kvbench.tasks.needlebench.inputs import NeedleBenchInputs, synthetic_reasoning_records, unique_needles
from kvbench.tasks.needlebench.spec import DEPTHS_11, DEPTHS_20, GROUPS, LANGUAGES, REPEATS, SIZES, SizeConfig
