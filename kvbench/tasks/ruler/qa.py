"""RULER's question answering (``qa_1`` SQuAD, ``qa_2`` HotpotQA): the gold documents among distractors."""

from __future__ import annotations

import logging
import math
import random

from kvbench.tasks.ruler.sizing import Generated, SizedGenerator
from kvbench.tasks.ruler.spec import QA_INSTRUCTION, QA_PREFIX

log = logging.getLogger(__name__)


class QAGenerator(SizedGenerator):
    """QA: a question over documents, the gold ones mixed with distractors up to the length."""

    def _build_qa(self, index: int, num_docs: int) -> Generated:
        corpus = self.inputs.qa_corpus(self.args["dataset"])
        record = corpus.questions[index]
        gold, more = list(record["context"]), list(record["more_context"])
        if num_docs < len(corpus.docs):
            if num_docs - len(gold) > len(more):
                taken = set(gold) | set(more)
                remaining = [i for i in range(len(corpus.docs)) if i not in taken]
                extra_count = max(0, num_docs - len(gold) - len(more))
                chosen = gold + more + self.rng.sample(remaining, min(extra_count, len(remaining)))
            else:
                chosen = gold + self.rng.sample(more, max(num_docs - len(gold), 0))
        else:
            repeats = math.ceil(num_docs / len(corpus.docs))
            chosen = (list(range(len(corpus.docs))) * repeats)[:num_docs]
            missing = [g for g in gold if g not in chosen]
            chosen = chosen[: len(chosen) - len(missing)] + missing
        docs = [corpus.docs[i] for i in chosen]
        random.Random(self.seed).shuffle(docs)
        documents = "\n\n".join(f"Document {i + 1}:\n{d}" for i, d in enumerate(docs))
        sample = Generated(
            context=QA_INSTRUCTION + "\n\nThe following are given documents.\n\n" + documents + "\n\n",
            question=QA_INSTRUCTION + "\n\nQuestion: " + record["query"],
            answer_prefix=QA_PREFIX,
            answers=list(record["outputs"]),
            extra={"num_docs": num_docs, "question_index": index},
        )
        return self._wrap(sample)

    def _generate_qa(self, num_samples: int) -> list[Generated]:
        corpus = self.inputs.qa_corpus(self.args["dataset"])
        if num_samples > len(corpus.questions):
            log.warning(
                "RULER %s: only %d questions in %s; generating %d samples",
                self.task.name,
                len(corpus.questions),
                corpus.source,
                len(corpus.questions),
            )
            num_samples = len(corpus.questions)
        incremental, units = self.search(lambda n: self._build_qa(0, n), 10)
        return [self.fit_sample(lambda n, i=i: self._build_qa(i, n), units, incremental) for i in range(num_samples)]
