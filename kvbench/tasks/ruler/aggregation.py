"""RULER's aggregation family: common words extraction (``cwe``, a numbered word list with a worked example) and
frequent words extraction (``fwe``, coded words drawn from a Zipf distribution)."""

from __future__ import annotations

import random
import string

import numpy as np

from kvbench.tasks.ruler.inputs import pseudo_words
from kvbench.tasks.ruler.sizing import Generated, SizedGenerator
from kvbench.tasks.ruler.spec import (
    CWE_INSTRUCTION,
    CWE_PREFIX,
    CWE_QUESTION,
    FWE_INSTRUCTION,
    FWE_PREFIX,
    FWE_QUESTION,
)


def _zeta(s: float, terms: int = 1000) -> float:
    """Riemann zeta for s > 1 (direct sum plus Euler-Maclaurin tail; |error| < 1e-12 for s >= 1.5)."""
    if s <= 1:
        raise ValueError("zeta needs s > 1")
    head = sum(k ** (-s) for k in range(1, terms))
    n = float(terms)
    return head + n ** (1 - s) / (s - 1) + 0.5 * n ** (-s) + s * n ** (-s - 1) / 12


class CommonWordsGenerator(SizedGenerator):
    """Common words extraction: the 10 words repeated most often in a numbered list."""

    #: The word lists' words in RULER's order (shuffled with the seed), made on first use.
    _cwe_words: list[str] | None = None

    def cwe_pool(self, needed: int) -> list[str]:
        """RULER's pools: the word lists' sorted unique words shuffled by ``random.Random(seed)``; when more words
        are needed than they hold, RULER's ``english_words.json`` (if found in the input folder), else our
        pseudo-words after the list words (a named stand-in)."""
        if self._cwe_words is None:
            self._cwe_words = list(self.inputs.cwe_words)
            random.Random(self.seed).shuffle(self._cwe_words)
        words = self._cwe_words
        if needed <= len(words):
            return words
        english = self.inputs.english_words
        if english is not None:
            return english
        if len(self.inputs.cwe_extra) < needed:
            self.inputs.cwe_extra = list(self.inputs.cwe_words) + pseudo_words(
                needed - len(words), set(self.inputs.cwe_words)
            )
        return self.inputs.cwe_extra

    def _cwe_example(self, num_words: int, common_repeats: int, uncommon_repeats: int, common_nums: int):
        pool = self.cwe_pool(num_words)
        chosen = self.rng.sample(pool, num_words)
        common, uncommon = chosen[:common_nums], chosen[common_nums:]
        word_list = common * common_repeats + uncommon * uncommon_repeats
        random.Random(self.seed).shuffle(word_list)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(word_list)), common

    def _build_cwe(self, num_words: int) -> Generated:
        a = self.args
        if self.length < 4096:
            shot_ctx, shot_answer = self._cwe_example(20, 3, 1, a["num_cw"])
            ctx, answer = self._cwe_example(num_words, 6, 1, a["num_cw"])
        else:
            shot_ctx, shot_answer = self._cwe_example(40, 10, 3, a["num_cw"])
            ctx, answer = self._cwe_example(num_words, a["freq_cw"], a["freq_ucw"], a["num_cw"])
        shot_reply = CWE_PREFIX + " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(shot_answer))
        sample = Generated(
            context=CWE_INSTRUCTION + ctx + "\n",
            question=CWE_QUESTION,
            answer_prefix=CWE_PREFIX,
            answers=answer,
            shots=((CWE_INSTRUCTION + shot_ctx + "\n" + CWE_QUESTION, shot_reply),),
        )
        return self._wrap(sample)

    def _generate_cwe(self, num_samples: int) -> list[Generated]:
        # RULER: a 4096-word probe, upper bound int(length // tokens_per_word) * 2, steps of 10 words.
        _, units = self.search(
            self._build_cwe, 10, probe_units=4096, estimate=lambda per_word: int(self.length // per_word) * 2
        )
        return [self.fit_sample(self._build_cwe, units, 10) for _ in range(num_samples)]


class FrequentWordsGenerator(SizedGenerator):
    """Frequent words extraction: the three most frequent coded words."""

    def _fwe_vocab(self, vocab_size: int) -> list[str]:
        words: set[str] = set()
        while len(words) < vocab_size:
            words.add("".join(self.rng.choices(string.ascii_lowercase, k=self.args["coded_wordlen"])))
        vocab = sorted(words)
        random.Random(self.seed).shuffle(vocab)
        vocab[0] = "..."
        return vocab

    def _build_fwe(self, vocab: list[str], num_words: int) -> Generated:
        alpha = self.args["alpha"]
        ranks = np.arange(1, len(vocab) + 1, dtype=float)
        counts = (num_words * ranks ** (-alpha) / _zeta(alpha)).astype(int)
        words = [w for w, c in zip(vocab, counts, strict=True) for _ in range(int(c))]
        random.Random(self.seed).shuffle(words)
        sample = Generated(
            context=FWE_INSTRUCTION + " ".join(words) + "\n",
            question=FWE_QUESTION,
            answer_prefix=FWE_PREFIX,
            answers=vocab[1:4],
        )
        return self._wrap(sample)

    def _generate_fwe(self, num_samples: int) -> list[Generated]:
        budget = self.length - self.max_new_tokens
        vocab_size = max(budget // 50, 4)
        step = max(budget // 32, 1)
        num_words = max(budget // 6, 1)
        vocab = self._fwe_vocab(vocab_size)
        while self.count(self._build_fwe(vocab, num_words)) < budget:
            num_words += step
        num_words = max(num_words - step, step)
        out = []
        for _ in range(num_samples):
            vocab = self._fwe_vocab(vocab_size)
            words = num_words
            sample = self._build_fwe(vocab, words)
            while self.count(sample) > budget:
                words -= step
                if words <= 0:
                    raise ValueError(f"RULER fwe: cannot fit a sample into {self.length} tokens")
                sample = self._build_fwe(vocab, words)
            sample.extra["units"] = words
            out.append(sample)
        return out
