"""RULER's 13 synthetic tasks (``task=ruler``), generated with the model's own tokenizer.

Implements NVIDIA/RULER's generators (``scripts/data/synthetic/*.py``, HEAD) from the description in
shared/specs/benchmarks.md section 2: templates, answer prefixes, ``tokens_to_generate``, needle/haystack procedures,
the size search (one sample of ``incremental`` units estimates tokens per unit, a binary search finds the largest
unit count whose freshly generated sample fits, then every sample shrinks by ``incremental`` until it fits) and the
scoring (``string_match_all`` / ``string_match_part``).

Prompt (official ``prepare.py``: ``model_template.format(task_template) + answer_prefix``): the task text is the
user message of the model's chat template (when ``model.chat_template`` is on) and the answer prefix follows the
template's assistant header, so the model continues it (``Sample.answer_prefix``).  CWE's worked example is a
complete turn of its own (the official template, model template included, formatted with the example and followed by
its answer); VT's in-context example sits at the start of the user message, as officially.  The NIAH singular rewrite
("Some" -> "A", ...) applies to the task template only (officially it also hits the model template's text, e.g.
"You are" in some system prompts; the templates RULER ships have no such words).

Length constraint (every task, official): ``tokens(full templated input incl. answer prefix) + max_new_tokens <=
task.length``, tokens counted as RULER's ``text_to_tokens`` (``tokenizer.tokenize``: special tokens written in the
template count, none is added).  With no chat template the runner adds the BOS on top, as RULER's HF client does.
``options.generator_tokenizer`` (off by default) counts with another tokenizer on the RULER-template text alone, as
RULER's ``prepare.py`` run with that model's tokenizer (kvpress's leaderboard data: ``llama3``, the base template);
``options.chat_template_kwargs`` are extra variables of the model's chat template (``enable_thinking: false``).

Prompt split (kvpress, followed by Ada-KV): ``context`` = instruction + haystack (and the VT/CWE in-context example),
``question`` = the final question sentence (+ the chat template's end of turn and assistant header + the answer
prefix).  ``options.answer_prefix: user`` is a named deviation: the answer prefix (and CWE's example answer) is
appended to the user message instead, as in prompts built from kvpress's RULER data with a chat template.

Inputs: the noise / needle haystacks, VT, CWE and FWE need nothing else; the essay haystack uses Paul Graham essays
(``PaulGrahamEssays.json``, RULER's ``scripts/data/synthetic/json`` layout), qa_1/qa_2 SQuAD v2.0 dev / HotpotQA
dev-distractor, NIAH keys and CWE words wonderwords' lists -- from ``task.data_dir`` (or ``./data/ruler``, where
``scripts/prepare_data.py ruler`` writes).  Missing files are replaced by shipped stand-ins (our filler essays, tiny
QA fixtures, ~1,000-word lists): recorded as such in metrics.json and warned about, never silently.

Modules: :mod:`~kvbench.tasks.ruler.spec` (the 13 tasks, templates), :mod:`~kvbench.tasks.ruler.inputs` (word
lists, essays, QA corpora), :mod:`~kvbench.tasks.ruler.sizing` (the size search every generator shares), one module
per family group (:mod:`~kvbench.tasks.ruler.niah`, :mod:`~kvbench.tasks.ruler.variable_tracking`,
:mod:`~kvbench.tasks.ruler.aggregation` for CWE and FWE, :mod:`~kvbench.tasks.ruler.qa`) and
:mod:`~kvbench.tasks.ruler.datasets` (datasets, the ``ruler`` builder and data preparer).
"""

from kvbench.tasks.ruler.datasets import ANSWER_PREFIX_MODES, RulerDataset, RulerGenerator, build_ruler, prepare_ruler
from kvbench.tasks.ruler.inputs import QACorpus, RulerInputs, load_qa, load_word_lists, read_hotpotqa, read_squad
from kvbench.tasks.ruler.sizing import Generated
from kvbench.tasks.ruler.spec import MAX_NEW_TOKENS, TASKS, RulerTask
