"""RULER's variable tracking (``vt``): chains of ``VAR X = VAR Y`` assignments hidden in noise, with a one-shot
in-context example -- RULER's ``variable_tracking.py`` draw for draw (names from the seeded ``random``, values from
numpy's legacy global generator seeded alike)."""

from __future__ import annotations

import string

import numpy as np

from kvbench.tasks.ruler.sizing import Generated, SizedGenerator
from kvbench.tasks.ruler.spec import NOISE_LINE, VT_INSTRUCTION, VT_PREFIX, VT_QUESTION

#: The one-shot example's placeholder value (RULER: ``12345``, replaced by a random value in every sample).
ICL_VALUE = "12345"


class VariableTrackingGenerator(SizedGenerator):
    """Variable tracking: which variables end up holding the queried value."""

    _np_rng: np.random.RandomState | None = None

    @property
    def np_rng(self) -> np.random.RandomState:
        """numpy's legacy generator seeded with the seed (RULER: ``np.random.seed(seed)``, ``np.random.randint``)."""
        if self._np_rng is None:
            self._np_rng = np.random.RandomState(self.seed)
        return self._np_rng

    def _name(self, size: int) -> str:
        return "".join(self.rng.choices(string.ascii_uppercase, k=size))

    def chains(self, is_icl: bool) -> tuple[list[list[str]], list[list[str]]]:
        """``(names per chain, lines per chain)``, RULER's ``generate_chains``: ``(hops + 1) * chains`` names drawn at
        once (duplicates kept), more appended while not all distinct (an appended name starts a chain of its own, as
        officially); the first line holds the value (``12345`` in the example), each next line copies the previous
        variable (with RULER's trailing space)."""
        a = self.args
        size = 3 if is_icl else 5
        hops = min(10, a["num_hops"]) if is_icl else a["num_hops"]
        wanted = (hops + 1) * a["num_chains"]
        names = [self._name(size) for _ in range(wanted)]
        while len(set(names)) < wanted:
            names.append(self._name(size))
        all_names, all_lines = [], []
        for start in range(0, len(names), hops + 1):
            chain = names[start : start + hops + 1]
            value = ICL_VALUE if is_icl else str(self.np_rng.randint(10000, 99999))
            lines = [f"VAR {chain[0]} = {value}"]
            lines += [f"VAR {chain[j + 1]} = VAR {chain[j]} " for j in range(hops)]
            all_names.append(chain)
            all_lines.append(lines)
        return all_names, all_lines

    def _build_vt_text(self, num_noises: int, is_icl: bool) -> Generated:
        """One sample without the worked example: chains inserted among ``num_noises`` noise lines."""
        names, chains = self.chains(is_icl)
        value = chains[0][0].split("=")[-1].strip()
        sentences = [NOISE_LINE] * num_noises
        for chain in chains:
            positions = sorted(self.rng.sample(range(len(sentences)), len(chain)))
            for offset, (pos, line) in enumerate(zip(positions, chain, strict=True)):
                sentences.insert(pos + offset, line)
        haystack = "\n".join(sentences).replace(". \n", ".\n")
        return Generated(
            context=VT_INSTRUCTION + haystack + "\n",
            question=VT_QUESTION.format(query=value),
            answer_prefix=VT_PREFIX.format(num_v=self.args["num_hops"] + 1, query=value),
            answers=names[0],
            extra={"_haystack": haystack, "_first_line": chains[0][0]},
        )

    def randomized_icl(self, example: str) -> str:
        """RULER's ``randomize_icl``: the example's last ``hops + 1`` words (the answer names) each replaced, all
        occurrences, by as many random capitals; then ``12345`` by a random value."""
        for item in example.strip().split()[-self.args["num_hops"] - 1 :]:
            example = example.replace(item, self._name(len(item)))
        return example.replace(ICL_VALUE, str(self.np_rng.randint(10000, 99999)))

    def _build_vt(self, num_noises: int) -> Generated:
        """A sample with the randomised worked example before the task instruction (inside the user turn)."""
        sample = self._wrap(self._build_vt_text(num_noises, False))
        icl = self.randomized_icl(self._icl) + "\n"
        head = self.template_head
        sample.context = head + icl + sample.context[len(head) :]
        return sample

    def _icl_example(self) -> str:
        """RULER's first pass: a 500-token example (5-noise-line steps, nothing to generate, the raw task template
        with its answer prefix whatever the model template), as ``input + " " + names + "\\n"``."""
        outer = self.length, self.max_new_tokens, self.use_chat_template, self.answer_prefix_mode
        self.length, self.max_new_tokens, self.use_chat_template, self.answer_prefix_mode = 500, 0, False, "user"
        try:

            def build(n: int) -> Generated:
                return self._build_vt_text(n, True)

            incremental, units = self.search(build, 5)
            try:
                example = self.fit_sample(build, units, incremental)
            except ValueError:  # a tokenizer too verbose for 5 noise lines in 500 tokens (byte-level)
                example = build(self.min_units)
        finally:
            self.length, self.max_new_tokens, self.use_chat_template, self.answer_prefix_mode = outer
        text = example.context + example.question + example.answer_prefix
        return text + " " + " ".join(example.answers) + "\n"

    def _generate_vt(self, num_samples: int) -> list[Generated]:
        self._icl = self._icl_example()
        example_tokens = self.tok.count(self._icl)
        incremental = 10 if self.length >= 4096 else 5
        # The size search counts the example's tokens separately from a sample built without it (as RULER).
        incremental, units = self.search(
            lambda n: self._wrap(self._build_vt_text(n, False)), incremental, extra_tokens=example_tokens
        )
        out = []
        for _ in range(num_samples):
            sample = self.fit_sample(self._build_vt, units, incremental)
            haystack, line = sample.extra.pop("_haystack"), sample.extra.pop("_first_line")
            sample.extra["depth"] = round(self._depth(haystack, haystack.find(line)), 2)
            out.append(sample)
        return out
