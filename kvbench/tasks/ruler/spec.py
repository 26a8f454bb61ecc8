"""RULER's 13 tasks (``scripts/synthetic.yaml``), their templates and ``tokens_to_generate``
(``scripts/data/synthetic/constants.py``), and the ``task.options`` defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

NOISE_LINE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE_TEMPLATE = "One of the special magic {type_needle_v} for {key} is: {value}."
#: Essay insertion depths: ``np.round(np.linspace(0, 100, 40)).astype(int)``.
ESSAY_DEPTHS: list[int] = [int(d) for d in np.round(np.linspace(0, 100, 40)).astype(int)]

NIAH_INSTRUCTION = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n"
)
NIAH_QUESTION = "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
NIAH_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"

VT_INSTRUCTION = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
VT_QUESTION = "Question: Find all variables that are assigned the value {query} in the text above."
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assigned "
    "the value {query}, they are: "
)

CWE_INSTRUCTION = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n"
)
CWE_QUESTION = "Question: What are the 10 most common words in the above list?"
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"

FWE_INSTRUCTION = (
    "Read the following coded text and track the frequency of each coded word. "
    "Find the three most frequently appeared coded words. "
)
FWE_QUESTION = (
    "Question: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?"
)
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"

QA_INSTRUCTION = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other words."
)
QA_PREFIX = " Answer:"

#: ``tokens_to_generate`` per generator.
MAX_NEW_TOKENS: dict[str, int] = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}


@dataclass(frozen=True)
class RulerTask:
    """One of the 13 tasks: generator name and its arguments (``scripts/synthetic.yaml``)."""

    name: str
    generator: str
    args: dict[str, Any] = field(default_factory=dict)


def _niah(name: str, haystack: str, k: str, v: str, nk: int = 1, nv: int = 1, nq: int = 1) -> RulerTask:
    args = dict(type_haystack=haystack, type_needle_k=k, type_needle_v=v, num_needle_k=max(nk, nq))
    args.update(num_needle_v=nv, num_needle_q=nq)
    return RulerTask(name, "niah", args)


TASKS: dict[str, RulerTask] = {
    t.name: t
    for t in (
        _niah("niah_single_1", "noise", "words", "numbers"),
        _niah("niah_single_2", "essay", "words", "numbers"),
        _niah("niah_single_3", "essay", "words", "uuids"),
        _niah("niah_multikey_1", "essay", "words", "numbers", nk=4),
        _niah("niah_multikey_2", "needle", "words", "numbers"),
        _niah("niah_multikey_3", "needle", "uuids", "uuids"),
        _niah("niah_multivalue", "essay", "words", "numbers", nv=4),
        _niah("niah_multiquery", "essay", "words", "numbers", nq=4),
        RulerTask("vt", "vt", {"num_chains": 1, "num_hops": 4}),
        RulerTask("cwe", "cwe", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}),
        RulerTask("fwe", "fwe", {"alpha": 2.0, "coded_wordlen": 6}),
        RulerTask("qa_1", "qa", {"dataset": "squad"}),
        RulerTask("qa_2", "qa", {"dataset": "hotpotqa"}),
    )
}

OPTION_DEFAULTS: dict[str, Any] = {
    #: Samples per task and length when task.num_samples is null (RULER: 500).
    "samples_per_task": 500,
    #: Override every task's tokens_to_generate (KVCache-Factory used 64); null = RULER's per-task values.
    "max_new_tokens": None,
    #: Where the answer prefix goes: "assistant" (official: after the chat template's assistant header) or "user"
    #: (named deviation: appended to the user message, CWE's example inline).
    "answer_prefix": "assistant",
    #: auto | shipped | hub (see kvbench.tasks.text_inputs.resolve_input_dir).
    "source": "auto",
    #: "ruler" (official): RULER's own per-model template (kvbench.tasks.ruler.templates) is part of the sample text
    #: and the model's chat template is not applied; "model" (named deviation): the model's published chat template.
    "chat_template": "ruler",
    #: With chat_template=ruler: "auto" (from the model, as RULER's config_models.sh) or a RULER template name.
    "ruler_template": "auto",
    #: Extra variables of the model's chat template (chat_template=model), e.g. {"enable_thinking": false} as
    #: kvpress's pipeline renders Qwen3's template; null = the template as published.  Not in conf/task/ruler.yaml:
    #: a run that does not set it keeps its config hash.
    "chat_template_kwargs": None,
    #: Generate with another tokenizer (a kvbench.models.tokenizers family, e.g. "llama3": Llama-3 / 3.1's vocabulary)
    #: for RULER's length counting, as RULER's prepare.py --tokenizer_path of that model: lengths are counted on the
    #: RULER-template text alone (chat_template=model: RULER's base template), the model's chat template is applied
    #: when the prompt is encoded.  null = the model's own tokenizer (and chat template).  Not in conf/task/ruler.yaml.
    "generator_tokenizer": None,
}

#: Version of the sample generators, part of the sample-cache key: bump it whenever generated samples change.
#: 2: RULER's draws, essay words, CWE pool, VT, essay joining and per-model templates reproduced (issue #27).
GENERATOR_VERSION = 2
